package openai

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/httpguard/httpguardtest"
)

// sendAs posts body to url with the given Content-Type header values (none
// when empty).
func sendAs(t *testing.T, url, body string, contentType ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range contentType {
		req.Header.Add("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestOnlyJSONBodiesAreServed: a POST whose body is not application/json is
// refused with 415 before anything runs, on every route that takes a body
// (issue 25: text/plain, forms and no content type used to run as JSON,
// which let a web page make a visitor's browser run completions).
func TestOnlyJSONBodiesAreServed(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, nil)
	bodies := map[string]string{
		"/v1/completions":      `{"model":"m","prompt":"a","max_tokens":2}`,
		"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":2}`,
		"/tokenize":            `{"prompt":"a"}`,
		"/detokenize":          `{"tokens":[100]}`,
		KVReleasePath:          `{"kv_transfer_params":{}}`,
	}
	for path, body := range bodies {
		for _, ct := range [][]string{{"text/plain"}, {"text/plain; charset=utf-8"}, {"application/x-www-form-urlencoded"}, {"multipart/form-data; boundary=x"}, nil, {"application/json", "text/plain"}} {
			t.Run(path+" refuses "+strings.Join(ct, ", "), func(t *testing.T) {
				checkError(t, sendAs(t, ts.URL+path, body, ct...), 415, apierror.TypeUnsupportedMediaType, "", "Only 'application/json' is allowed")
			})
		}
	}
	t.Run("without the API key it is a 401 first, as in vLLM", func(t *testing.T) {
		_, keyed := newTestServer(t, b, func(c *Config) { c.APIKey = "sk-test-key" })
		resp := sendAs(t, keyed.URL+"/v1/completions", bodies["/v1/completions"], "text/plain")
		checkError(t, resp, 401, TypeUnauthorized, "", "")
	})
	if got := b.requests(); len(got) != 0 {
		t.Fatalf("refused requests reached the engine: %d", len(got))
	}
	for path, body := range bodies {
		if path == KVReleasePath {
			continue // served by a KVReleaser, which this server has not
		}
		for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON"} {
			t.Run(path+" serves "+ct, func(t *testing.T) {
				if resp := sendAs(t, ts.URL+path, body, ct); resp.StatusCode != 200 {
					t.Errorf("status %d", resp.StatusCode)
				}
			})
		}
	}
}

// TestInvalidUTF8IsRefused: a body that is not UTF-8 is a 400, not a
// request run on U+FFFD in place of the client's bytes (issue 25).
func TestInvalidUTF8IsRefused(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, nil)
	for _, c := range []struct{ name, path, body string }{
		{"an invalid byte in a prompt", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\xffb\"}"},
		{"a cut character in a message", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xe2\x82\"}]}"},
		{"a surrogate in a key", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\",\"\xed\xa0\x80\":1}"},
		{"an invalid byte in tokenize's prompt", "/tokenize", "{\"prompt\":\"\xc0\xaf\"}"},
	} {
		t.Run(c.name+" is a 400", func(t *testing.T) {
			resp, _ := post(t, ts.URL+c.path, c.body, nil)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
		})
	}
	t.Run("the 400 says what is wrong", func(t *testing.T) {
		resp := sendAs(t, ts.URL+"/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\xffb\"}", "application/json")
		checkError(t, resp, 400, TypeBadRequest, "", "not valid UTF-8 (at byte 24)")
	})
	if got := b.requests(); len(got) != 0 {
		t.Fatalf("refused requests reached the engine: %d", len(got))
	}
	t.Run("valid UTF-8 is served", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"héllo 日本 🙂","max_tokens":1}`, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if got := b.requests(); len(got) != 1 || len(got[0].Prompt) != 1+len("héllo 日本 🙂") {
			t.Errorf("prompt not tokenized byte for byte: %+v", got)
		}
	})
}

// TestMissingModelIsTheServedModel: a request that names no model (absent,
// null or "") is served by the one model and answered with its name, as
// vLLM does (issue 25); a wrong name is still vLLM's 404.
func TestMissingModelIsTheServedModel(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, nil)
	for _, c := range []struct{ name, path, body string }{
		{"completions without model", "/v1/completions", `{"prompt":"a","max_tokens":2}`},
		{"completions with a null model", "/v1/completions", `{"model":null,"prompt":"a","max_tokens":2}`},
		{"completions with an empty model", "/v1/completions", `{"model":"","prompt":"a","max_tokens":2}`},
		{"chat without model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":2}`},
		{"streamed chat without model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":2,"stream":true}`},
	} {
		t.Run(c.name+" is served", func(t *testing.T) {
			resp, body := post(t, ts.URL+c.path, c.body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if strings.Contains(c.body, `"stream":true`) {
				if !strings.Contains(string(body), `"model":"m"`) {
					t.Errorf("stream does not name model m: %s", body)
				}
				return
			}
			var r struct{ Model string }
			if err := json.Unmarshal(body, &r); err != nil || r.Model != "m" {
				t.Errorf("model %q (%v), want m: %s", r.Model, err, body)
			}
		})
	}
	t.Run("a wrong model is still a 404", func(t *testing.T) {
		resp, _ := post(t, ts.URL+"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"a"}]}`, nil)
		if resp.StatusCode != 404 {
			t.Errorf("status %d, want 404", resp.StatusCode)
		}
	})
}

// TestAmbiguousFramingClosesTheConnection: a request with Content-Length
// and Transfer-Encoding (or an obs-folded one, or HTTP/1.0 with
// Transfer-Encoding) is answered and its connection closed, so bytes
// smuggled behind it are never served (issue 24, RFC 9112 §6.1).
func TestAmbiguousFramingClosesTheConnection(t *testing.T) {
	_, ts := newTestServer(t, newFakeBackend(echoScript("hello")), nil)
	httpguardtest.CheckFraming(t, ts.Listener.Addr().String(), "/v1/completions")
}
