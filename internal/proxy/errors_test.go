package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// TestInternalErrorIsGeneric makes the decode leg fail inside the proxy
// (its request cannot be built): the client gets a generic OpenAI-shaped
// 500 that names no backend, and the prefill's KV is released.
func TestInternalErrorIsGeneric(t *testing.T) {
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{dec})
	const bad = "http://decode.internal:8001 bad"
	p.decode.list()[0].base = bad
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	checkOpenAIError(t, body, http.StatusInternalServerError)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("status %d, want 500", resp.StatusCode)
	}
	for _, leak := range []string{"decode.internal", "8001", "invalid"} {
		if strings.Contains(body, leak) {
			t.Errorf("the client's error names %q: %s", leak, body)
		}
	}
	waitFor(t, func() bool {
		for _, r := range pre.requests() {
			if r.Path == kvReleasePath {
				return true
			}
		}
		return false
	})
}
