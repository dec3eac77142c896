package proxy

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVLLMRecordedMetricsScrape runs the proxy's scraper over the /metrics
// text recorded from a running vllm serve (testdata/vllm/<version>/metrics.txt,
// written by scripts/vllm/record.sh; see docs/usage/vllm.md): every metric it
// routes on must be there, under the name and labels vLLM exports, and parse.
func TestVLLMRecordedMetricsScrape(t *testing.T) {
	files, _ := filepath.Glob("../../testdata/vllm/*/metrics.txt")
	if len(files) == 0 {
		t.Fatal("no recorded vLLM /metrics under testdata/vllm: they are committed; re-create them with bash scripts/vllm/record.sh")
	}
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text := string(raw)
			for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
				if !strings.Contains(text, "\n"+name+"{") {
					t.Errorf("vLLM no longer exports %s (the proxy's load signal)", name)
				}
			}
			s, ok := parseEngineMetrics(bufio.NewScanner(strings.NewReader(text)))
			w, r, kv := s.waiting, s.running, s.kvUsage
			if !ok {
				t.Fatal("the scraper found none of its metrics in vLLM's /metrics")
			}
			// Recorded idle, after the requests finished.
			if w != 0 || r != 0 || kv < 0 || kv > 1 {
				t.Errorf("waiting %v running %v kv usage %v: want 0, 0 and a fraction", w, r, kv)
			}
		})
	}
}
