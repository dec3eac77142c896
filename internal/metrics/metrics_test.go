package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEngineExportsGoRuntime: an engine's /metrics carries the Go runtime
// and process collectors next to the vLLM-named ones.
func TestEngineExportsGoRuntime(t *testing.T) {
	e := NewEngine("m")
	rec := httptest.NewRecorder()
	e.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	for _, want := range []string{"\ngo_goroutines ", "\ngo_threads ", "\ngo_memstats_heap_inuse_bytes ", "\nprocess_resident_memory_bytes ", "vllm:num_requests_running"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}

func TestSetInfoPublishesTheEnginesConfiguration(t *testing.T) {
	e := NewEngine("m")
	e.SetInfo("both", 64, 512)
	rec := httptest.NewRecorder()
	e.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	want := `tandem:engine_info{max_num_batched_tokens="512",max_num_seqs="64",role="both"} 1`
	if !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
