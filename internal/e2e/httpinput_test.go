package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/httpguard/httpguardtest"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// postRaw posts body to url with the given Content-Type (none when empty).
func postRaw(t *testing.T, url, contentType string, body []byte) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestHTTPInputOnRealProcesses: proxy → prefill → decode, real processes.
// What issues 24 and 25 found as a new user and as an attacker: a body that
// is not application/json or not UTF-8 ran anyway, a request without model
// was refused, a request smuggled behind Content-Length plus
// Transfer-Encoding was served, and a body near the proxy's limit got the
// prefill's 413. Each is checked on the proxy and on an engine directly.
func TestHTTPInputOnRealProcesses(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t))
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill"})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode"})
	proxyURL := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})
	targets := []struct{ name, url string }{{"the proxy", proxyURL}, {"an engine", decode.url}}
	valid := []byte(`{"model":"m","prompt":"Once upon a time","max_tokens":4}`)

	for _, tg := range targets {
		t.Run(tg.name+": a body that is not application/json is a 415", func(t *testing.T) {
			for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
				if r := postRaw(t, tg.url+"/v1/completions", ct, valid); r.status != 415 || !bytes.Contains(r.body, []byte("UnsupportedMediaTypeError")) {
					t.Errorf("Content-Type %q: %d %s", ct, r.status, r.body)
				}
			}
			if r := postRaw(t, tg.url+"/v1/completions", "application/json; charset=utf-8", valid); r.status != 200 {
				t.Errorf("application/json; charset=utf-8: %d %s", r.status, r.body)
			}
		})
		t.Run(tg.name+": a body that is not UTF-8 is a 400", func(t *testing.T) {
			r := postRaw(t, tg.url+"/v1/completions", "application/json", []byte("{\"model\":\"m\",\"prompt\":\"Once \xff upon\",\"max_tokens\":4}"))
			if r.status != 400 || !bytes.Contains(r.body, []byte("not valid UTF-8")) {
				t.Errorf("%d %s", r.status, r.body)
			}
		})
		t.Run(tg.name+": a request without model is served by the served model", func(t *testing.T) {
			// (Chat too, in package openai: this model has no chat template.)
			r := postJSON(t, tg.url+"/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 4})
			var got struct{ Model string }
			if err := json.Unmarshal(r.body, &got); r.status != 200 || err != nil || got.Model != servedName {
				t.Errorf("%d %s (x-tandem-pd %q)", r.status, r.body, r.pd())
			}
		})
		t.Run(tg.name+": ambiguous framing closes the connection", func(t *testing.T) {
			httpguardtest.CheckFraming(t, strings.TrimPrefix(tg.url, "http://"), "/v1/completions")
		})
	}
	t.Run("a body at the proxy's default limit is served on the P/D path", func(t *testing.T) {
		head, end := `{"model":"m","prompt":"Once upon a time","max_tokens":4,"pad":"`, `"}`
		body := head + strings.Repeat("a", proxy.DefaultMaxBodyBytes-len(head)-len(end)) + end
		r := postRaw(t, proxyURL+"/v1/completions", "application/json", []byte(body))
		if r.status != 200 || r.pd() != "remote" {
			t.Errorf("%d (x-tandem-pd %q): %s", r.status, r.pd(), tail(string(r.body), 300))
		}
		r = postRaw(t, proxyURL+"/v1/completions", "application/json", []byte(body[:len(head)]+"a"+body[len(head):]))
		if r.status != 413 {
			t.Errorf("one byte more: %d, want the proxy's 413: %s", r.status, tail(string(r.body), 300))
		}
	})
}
