package openai

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzCompletionsBody feeds arbitrary bodies to /v1/completions and
// /v1/chat/completions over a fake engine: the server must answer every one
// with a well-formed status and never panic.
func FuzzCompletionsBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"abc","max_tokens":3}`,
		`{"model":"m","prompt":[[1,2],[3]],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"logprobs":true,"top_logprobs":2}`,
		`{"model":"m","prompt":"a","stop":["x",""],"logit_bias":{"5":100},"kv_transfer_params":{"do_remote_decode":true}}`,
		`{"model":"m","prompt":null}`, `[]`, `"x"`, `{"model":"m","prompt":[1e99]}`,
	} {
		f.Add(s)
	}
	b := newFakeBackend(echoScript("hello"))
	s, err := NewServer(Config{Backend: b, Tokenizer: byteTokenizer{}, ModelName: "m",
		ChatTemplate: func(msgs []Message, gen bool) (string, error) { return "chat", nil }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			s.ServeHTTP(w, r)
			if w.Code != 200 && w.Code != 400 && w.Code != 404 {
				t.Fatalf("%s: status %d for %q: %s", path, w.Code, body, w.Body)
			}
			if w.Code != 200 && !strings.HasPrefix(w.Body.String(), `{"error":`) {
				t.Fatalf("%s: error body %q", path, w.Body)
			}
		}
	})
}
