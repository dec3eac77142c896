package soak

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// ParseVmRSS returns the VmRSS of a /proc/PID/status text in bytes.
func ParseVmRSS(status string) (int64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected VmRSS line %q: %w", strings.TrimSpace(line), err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS line (a kernel thread or a zombie?)")
}

// RSS reads the resident set size of process pid.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return ParseVmRSS(string(b))
}

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
