package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestMetricsExportGoRuntime: the proxy's /metrics carries the Go runtime
// and process collectors, so a goroutine leak is visible as a number.
func TestMetricsExportGoRuntime(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	_, url := startProxy(t, Config{}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"\ngo_goroutines ", "\ngo_threads ", "\ngo_memstats_heap_inuse_bytes ", "\nprocess_resident_memory_bytes "} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}
