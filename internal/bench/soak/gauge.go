package soak

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"strings"
)

// ParseGauge sums the samples of the metric name (over all its label sets)
// in a Prometheus text exposition; ok is false when none is present.
func ParseGauge(r io.Reader, name string) (v float64, ok bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end < 0 || line[:end] != name {
			continue
		}
		val := line[end:]
		if line[end] == '{' {
			// Labels may hold spaces: the value follows the closing brace.
			i := strings.LastIndexByte(line, '}')
			if i < 0 {
				continue
			}
			val = line[i+1:]
		}
		fs := strings.Fields(val)
		if len(fs) == 0 {
			continue
		}
		x, perr := strconv.ParseFloat(fs[0], 64)
		if perr != nil || math.IsNaN(x) {
			continue
		}
		v, ok = v+x, true
	}
	return v, ok, sc.Err()
}
