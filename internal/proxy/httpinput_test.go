package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/httpguard/httpguardtest"
	"github.com/tandem-serve/tandem/internal/openai"
)

// TestOnlyJSONBodiesAreServed: a generation request whose body is not
// application/json is refused with 415 and reaches no engine (issue 25: a
// web page could make a visitor's browser run completions through the
// proxy with a text/plain or form body, which needs no CORS preflight).
func TestOnlyJSONBodiesAreServed(t *testing.T) {
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	for _, path := range generationPaths {
		for _, ct := range [][]string{{"text/plain"}, {"application/x-www-form-urlencoded"}, {"multipart/form-data; boundary=x"}, nil, {"application/json", "text/plain"}} {
			t.Run(path+" refuses "+strings.Join(ct, ", "), func(t *testing.T) {
				resp, body := post(t, url, path, `{"prompt":"x"}`, http.Header{"Content-Type": ct})
				if resp.StatusCode != 415 {
					t.Fatalf("status %d, want 415: %s", resp.StatusCode, body)
				}
				checkOpenAIError(t, body, 415)
				if !strings.Contains(body, apierror.TypeUnsupportedMediaType) || !strings.Contains(body, "Only 'application/json' is allowed") {
					t.Errorf("error body %s", body)
				}
			})
		}
	}
	if n := len(pre.requests()) + len(dec.requests()); n != 0 {
		t.Fatalf("refused requests reached the engines: %d", n)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "APPLICATION/JSON"} {
		t.Run("serves "+ct, func(t *testing.T) {
			if resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"Content-Type": {ct}}); resp.StatusCode != 200 {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
		})
	}
	t.Run("without the API key it is a 401 first", func(t *testing.T) {
		_, keyed := startProxy(t, Config{Fallback: true, APIKey: "pk"}, []*fakeEngine{pre}, []*fakeEngine{dec})
		resp, body := post(t, keyed, "/v1/completions", `{"prompt":"x"}`, http.Header{"Content-Type": {"text/plain"}})
		if resp.StatusCode != 401 {
			t.Errorf("status %d, want 401: %s", resp.StatusCode, body)
		}
	})
}

// TestInvalidUTF8IsRefused: a body that is not UTF-8 is a 400 at the proxy,
// which would otherwise send it on to both engines.
func TestInvalidUTF8IsRefused(t *testing.T) {
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	for _, body := range []string{"{\"prompt\":\"a\xffb\"}", "{\"prompt\":\"\xe2\x82", "{\"\xc0\xaf\":1,\"prompt\":\"a\"}"} {
		resp, got := post(t, url, "/v1/completions", body, nil)
		if resp.StatusCode != 400 || !strings.Contains(got, "not valid UTF-8") {
			t.Errorf("%q: status %d, %s; want a 400 saying the body is not UTF-8", body, resp.StatusCode, got)
		}
	}
	if n := len(pre.requests()) + len(dec.requests()); n != 0 {
		t.Fatalf("refused requests reached the engines: %d", n)
	}
	if resp, got := post(t, url, "/v1/completions", `{"prompt":"héllo 🙂"}`, nil); resp.StatusCode != 200 {
		t.Errorf("valid UTF-8: status %d, %s", resp.StatusCode, got)
	}
}

// TestAmbiguousFramingClosesTheConnection: a request with Content-Length
// and Transfer-Encoding (or an obs-folded one, or HTTP/1.0 with
// Transfer-Encoding) is answered and its connection closed, so bytes
// smuggled behind it are never served as a second request (issue 24, RFC
// 9112 §6.1).
func TestAmbiguousFramingClosesTheConnection(t *testing.T) {
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	httpguardtest.CheckFraming(t, strings.TrimPrefix(url, "http://"), "/v1/completions")
}

// TestBodyLimitsAgree: a client body at the proxy's default limit still fits
// the engines' default limit on both legs, with the fields the proxy adds
// (issue 24: bodies within ~2 KB of 16 MiB passed the proxy and got 413
// from the prefill), and one byte more is the proxy's own 413.
func TestBodyLimitsAgree(t *testing.T) {
	if engineMaxBodyBytes != openai.DefaultMaxBodyBytes {
		t.Fatalf("engineMaxBodyBytes %d, the engines' default is %d", engineMaxBodyBytes, openai.DefaultMaxBodyBytes)
	}
	// The prefill's params name the blocks of a 128k-token prompt (8192
	// blocks of 16), as large as a long-context engine's get.
	ids := make([]string, 8192)
	for i := range ids {
		ids[i] = fmt.Sprint(1000000 + i)
	}
	kv := `{"do_remote_prefill":true,"remote_block_ids":[[` + strings.Join(ids, ",") + `]],"remote_engine_id":"p-0","remote_request_id":"r-1","remote_host":"127.0.0.1","remote_port":5600,"remote_num_tokens":131072,"kv_transfer_sig":"` + strings.Repeat("s", 128) + `"}`
	// Each fake engine enforces the engines' default limit.
	limited := func(answer func(w http.ResponseWriter, r *http.Request, body []byte)) func(w http.ResponseWriter, r *http.Request, body []byte) {
		return func(w http.ResponseWriter, r *http.Request, body []byte) {
			if len(body) > openai.DefaultMaxBodyBytes {
				apierror.WriteError(w, apierror.NewError(413, "", "request body is larger than the limit of %d bytes", openai.DefaultMaxBodyBytes))
				return
			}
			answer(w, r, body)
		}
	}
	pre := newFake(t, limited(func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":%s}`, kv)
	}))
	dec := newFake(t, limited(decodeJSON))
	p, url := startProxy(t, Config{Fallback: false}, []*fakeEngine{pre}, []*fakeEngine{dec})
	limit := int(p.cfg.MaxBodyBytes) // the default

	// body returns a completion request of exactly n bytes.
	body := func(n int) string {
		head, tail := `{"prompt":"x","max_tokens":5,"stream":true,"pad":"`, `"}`
		return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
	}
	t.Run("a body at the proxy's limit is served on both legs", func(t *testing.T) {
		resp, got := post(t, url, "/v1/completions", body(limit), nil)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderPD) != "remote" {
			t.Fatalf("status %d, %s %q: %.300s", resp.StatusCode, HeaderPD, resp.Header.Get(HeaderPD), got)
		}
		reqs := dec.requests()
		if len(reqs) != 1 || len(reqs[0].Body) <= limit+len(kv)-100 {
			t.Fatalf("the decode leg did not carry the prefill's params: %d requests", len(reqs))
		}
	})
	t.Run("one byte more is the proxy's 413", func(t *testing.T) {
		resp, got := post(t, url, "/v1/completions", body(limit+1), nil)
		if resp.StatusCode != 413 || resp.Header.Get(HeaderPD) != "" {
			t.Fatalf("status %d, %s %q: %.300s", resp.StatusCode, HeaderPD, resp.Header.Get(HeaderPD), got)
		}
		if !strings.Contains(got, "--max-body-bytes") {
			t.Errorf("the 413 is not the proxy's: %s", got)
		}
	})
}
