package proxy

import (
	"io"
	"net/http"
	"testing"
)

// TestBatchPromptIsPrefilledByTheDecode: a batch prompt goes to a decode
// without kv_transfer_params (engines refuse them on a batch), said in
// X-Tandem-Pd; one prompt, even in a list, keeps the remote path.
func TestBatchPromptIsPrefilledByTheDecode(t *testing.T) {
	// The prefill refuses a batch with params as the engines do.
	pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		obj, _ := parseObject(body)
		if isBatchPrompt(r.URL.Path, obj) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"kv_transfer_params apply to one prompt; got 2 prompts","type":"invalid_request_error","param":"kv_transfer_params","code":400}}`)
			return
		}
		prefillOK(w, r, body)
	})
	dec := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{dec})
	for _, tt := range []struct {
		name, body, wantPD string
	}{
		{"two prompts", `{"prompt":["a b","c"],"max_tokens":2}`, "local; reason=" + reasonBatchPrompt},
		{"two token-id prompts", `{"prompt":[[1,2],[3]],"max_tokens":2}`, "local; reason=" + reasonBatchPrompt},
		{"one prompt in a list", `{"prompt":["a b"],"max_tokens":2}`, "remote"},
		{"one token-id prompt", `{"prompt":[1,2,3],"max_tokens":2}`, "remote"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(pre.requests())
			resp, body := post(t, url, "/v1/completions", tt.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("answer %d %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get(HeaderPD); got != tt.wantPD {
				t.Errorf("%s = %q, want %q", HeaderPD, got, tt.wantPD)
			}
			got := dec.requests()
			last := got[len(got)-1].Body
			if tt.wantPD == "remote" {
				return
			}
			if last != tt.body {
				t.Errorf("decode got %s, want the client's body verbatim", last)
			}
			if n := len(pre.requests()) - before; n != 0 {
				t.Errorf("the prefill got %d legs for a batch", n)
			}
		})
	}
	if n := metricValue(t, p, "tandem:proxy_pd_decisions_total", map[string]string{"decision": "local", "reason": reasonBatchPrompt}); n != 2 {
		t.Errorf("pd_decisions_total{local, %s} = %v, want 2", reasonBatchPrompt, n)
	}
}
