package proxy

import (
	"net/http"
	"testing"
)

// TestStageHistograms checks that a P/D request is timed in each stage of
// tandem:proxy_stage_seconds once.
func TestStageHistograms(t *testing.T) {
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	p, url := startProxy(t, Config{}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4}`, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPD) != "remote" {
		t.Fatalf("answer %s, %s %q: %s", resp.Status, HeaderPD, resp.Header.Get(HeaderPD), body)
	}
	for _, stage := range stages {
		if got := metricValue(t, p, "tandem:proxy_stage_seconds", map[string]string{"stage": stage}); got != 1 {
			t.Errorf("stage %s observed %v times, want 1", stage, got)
		}
	}
}
