// Package benchtest holds fakes for the tests of the benchmark client and
// of the commands built on it.
package benchtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// CompletionsOnly is an OpenAI-compatible server with nothing but streaming
// /v1/completions, like vLLM's toy P/D proxy or a gateway: /v1/models and
// /tokenize are 404. It records the model names and prompts it was sent and
// the other paths tried.
type CompletionsOnly struct {
	mu     sync.Mutex
	models map[string]int
	other  []string
}

// NewCompletionsOnly starts a CompletionsOnly server for the test's
// lifetime and returns it with its URL.
func NewCompletionsOnly(t testing.TB) (*CompletionsOnly, string) {
	f := &CompletionsOnly{models: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// ServeHTTP answers /v1/completions with MaxTokens chunks and usage, and
// everything else with 404.
func (f *CompletionsOnly) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string  `json:"model"`
		Prompt    []int32 `json:"prompt"`
		MaxTokens int     `json:"max_tokens"`
	}
	if r.URL.Path != "/v1/completions" {
		f.mu.Lock()
		f.other = append(f.other, r.URL.Path)
		f.mu.Unlock()
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.models[req.Model]++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range req.MaxTokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"Lily %d \"}]}\n\n", i)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", len(req.Prompt), req.MaxTokens)
}

// Models counts the requests sent for each model name.
func (f *CompletionsOnly) Models() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.models))
	maps.Copy(out, f.models)
	return out
}

// Other lists the paths tried other than /v1/completions, in order.
func (f *CompletionsOnly) Other() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.other...)
}
