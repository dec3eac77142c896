package testutil

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Metric reads a server's /metrics at url and returns the value of the
// first sample of name whose line contains label (any sample of name when
// label is empty). It fails the test when there is none.
func Metric(t testing.TB, url, name, label string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if (strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ")) && strings.Contains(line, label) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s/metrics has no sample of %s matching %q", url, name, label)
	return 0
}
