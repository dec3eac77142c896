package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAPIKeys(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Config
		clientAuth  string // Authorization the client sends
		wantStatus  int
		wantBackend string // Authorization the legs carry
	}{
		{"no key: the client's header passes through", Config{}, "Bearer anything", 200, "Bearer anything"},
		{"a proxy key is required and sent to the engines", Config{APIKey: "pk"}, "Bearer pk", 200, "Bearer pk"},
		{"the scheme is case-insensitive", Config{APIKey: "pk"}, "bearer pk", 200, "Bearer pk"},
		{"a backend key replaces the client's", Config{APIKey: "pk", BackendAPIKey: "bk"}, "Bearer pk", 200, "Bearer bk"},
		{"a backend key alone leaves the proxy open", Config{BackendAPIKey: "bk"}, "Bearer client", 200, "Bearer bk"},
		{"a missing key is a 401", Config{APIKey: "pk"}, "", 401, ""},
		{"a wrong key is a 401", Config{APIKey: "pk"}, "Bearer pk2", 401, ""},
		{"another scheme is a 401", Config{APIKey: "pk"}, "Basic pk", 401, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, tt.cfg, []*fakeEngine{pre}, []*fakeEngine{dec})
			h := http.Header{}
			if tt.clientAuth != "" {
				h.Set("Authorization", tt.clientAuth)
			}
			resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, h)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.wantStatus)
			}
			if tt.wantStatus == http.StatusUnauthorized {
				checkOpenAIError(t, body, 401)
				if !strings.Contains(body, `"type":"AuthenticationError"`) || strings.Contains(body, "pk2") {
					t.Errorf("401 body %s: want type AuthenticationError and no echo of the key", body)
				}
				if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("WWW-Authenticate %q", got)
				}
				if n := len(pre.requests()) + len(dec.requests()); n != 0 {
					t.Errorf("backends got %d requests, want 0", n)
				}
				return
			}
			for _, r := range append(pre.requests(), dec.requests()...) {
				if got := r.Header.Values("Authorization"); !cmp.Equal(got, []string{tt.wantBackend}) {
					t.Errorf("%s leg Authorization %q, want [%q]", r.Path, got, tt.wantBackend)
				}
			}
		})
	}

	t.Run("with a key, only /health and /metrics are open", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) { io.WriteString(w, `{"data":[]}`) })
		p, url := startProxy(t, Config{APIKey: "pk"}, []*fakeEngine{pre}, []*fakeEngine{dec})
		if !p.Ready() {
			t.Fatal("the health checker marked the backends down")
		}
		for _, c := range []struct {
			method, path string
			want         int
		}{
			{"GET", "/health", 200},
			{"HEAD", "/health", 200},
			{"GET", "/metrics", 200},
			{"GET", "/v1/models", 401},
			{"POST", "/v1/chat/completions", 401},
			{"GET", "/unknown", 401},
		} {
			req, _ := http.NewRequest(c.method, url+c.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("%s %s without a key: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
			}
		}
		req, _ := http.NewRequest("GET", url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer pk")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("/v1/models with the key: %d", resp.StatusCode)
		}
		if got := dec.requests()[0].Header.Get("Authorization"); got != "Bearer pk" {
			t.Errorf("/v1/models reached the decode with Authorization %q", got)
		}
	})
}

func TestBadRequestIDsAreRefused(t *testing.T) {
	for _, id := range []string{"has space", "tab\there", "caf\u00e9", strings.Repeat("a", 257)} {
		t.Run(id[:min(len(id), 16)], func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {id}})
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"param":"X-Request-Id"`) {
				t.Errorf("got %d %s, want a 400 naming X-Request-Id", resp.StatusCode, body)
			}
			if got := resp.Header.Get("X-Request-Id"); got != "" {
				t.Errorf("a refused id was echoed: %q", got)
			}
			if n := len(pre.requests()) + len(dec.requests()); n != 0 {
				t.Errorf("backends got %d requests, want 0", n)
			}
			if got := metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeBadRequest}); got != 1 {
				t.Errorf("requests_total{outcome=bad_request} = %v", got)
			}
		})
	}
	t.Run("the longest printable id is accepted", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, decodeJSON)
		_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		id := strings.Repeat("~!", 128)
		resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {id}})
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
			t.Errorf("got %d, id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
		}
	})
}

func TestClientKVParamsNeverForwarded(t *testing.T) {
	const client = `{"prompt":"x","Kv_Transfer_Params":{"do_remote_prefill":true,"remote_host":"10.0.0.1","remote_port":1},"max_tokens":2,"kv_transfer_params":{"remote_port":2}}`
	t.Run("remote path: the prefill gets the proxy's params, the decode only the prefill's", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, decodeJSON)
		_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", client, nil)
		want := []string{
			`{"prompt":"x",` + wantPrefillKV + `,"max_tokens":1,"stream":false}`,
			`{"prompt":"x","kv_transfer_params":` + testKV + `,"max_tokens":2}`,
		}
		got := []string{pre.requests()[0].Body, dec.requests()[0].Body}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("leg bodies (-want +got):\n%s", diff)
		}
	})
	t.Run("fallback path: the decode gets none", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		pre.health.Store(http.StatusServiceUnavailable)
		dec := newFake(t, decodeJSON)
		_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		resp, _ := post(t, url, "/v1/completions", client, nil)
		if got := resp.Header.Get(HeaderPD); got != "fallback; reason=no_healthy_prefill" {
			t.Errorf("%s = %q", HeaderPD, got)
		}
		if diff := cmp.Diff(`{"prompt":"x","max_tokens":2}`, dec.requests()[0].Body); diff != "" {
			t.Errorf("decode body (-want +got):\n%s", diff)
		}
	})
}

// releases returns the bodies of the KV releases a fake prefill received.
func releases(f *fakeEngine) []received {
	var out []received
	for _, r := range f.requests() {
		if r.Path == "/tandem/kv/release" {
			out = append(out, r)
		}
	}
	return out
}

// prefillWithRelease answers prefill legs like prefillOK and releases with
// 200 {"released": true}.
func prefillWithRelease(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.URL.Path == "/tandem/kv/release" {
		io.WriteString(w, `{"released":true}`)
		return
	}
	prefillOK(w, r, body)
}

func TestPrefillKVReleasedWhenDecodeNeverStarts(t *testing.T) {
	wantBody := `{"kv_transfer_params":` + testKV + `}`
	tests := []struct {
		name       string
		decode     func(w http.ResponseWriter, r *http.Request, body []byte)
		decodeDown bool
		hangUp     bool // the client leaves between the legs
		wantReason string
		wantStatus int
	}{
		{
			name: "the decode refuses the request with a 400",
			decode: func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`)
			},
			wantReason: releaseDecodeRefused,
			wantStatus: 400,
		},
		{
			name: "the decode answers 503",
			decode: func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, "draining", http.StatusServiceUnavailable)
			},
			wantReason: releaseDecodeRefused,
			wantStatus: 503,
		},
		{
			name:       "the decode is unreachable",
			decode:     decodeJSON,
			decodeDown: true,
			wantReason: releaseDecodeUnreachable,
			wantStatus: 502,
		},
		{
			name:       "the client hangs up between the legs",
			decode:     decodeJSON,
			hangUp:     true,
			wantReason: releaseClientCanceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillWithRelease)
			dec := newFake(t, tt.decode)
			p, url := startProxy(t, Config{Fallback: true, APIKey: "pk", BackendAPIKey: "bk"}, []*fakeEngine{pre}, []*fakeEngine{dec})
			if tt.decodeDown {
				dec.srv.Close()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.hangUp {
				p.betweenLegs = func(reqCtx context.Context) {
					cancel()
					<-reqCtx.Done() // the proxy has seen the client go
				}
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer pk")
			req.Header.Set("X-Request-Id", "rel-1")
			resp, err := http.DefaultClient.Do(req)
			switch {
			case tt.hangUp:
				if err == nil {
					resp.Body.Close()
					t.Fatalf("the client got an answer (%d) after hanging up", resp.StatusCode)
				}
			case err != nil:
				t.Fatal(err)
			default:
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.wantStatus {
					t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
				}
			}
			waitFor(t, func() bool {
				return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": tt.wantReason, "result": releaseOK}) == 1
			})
			p.bg.Wait()
			rel := releases(pre)
			if len(rel) != 1 {
				t.Fatalf("prefill got %d releases, want 1", len(rel))
			}
			if rel[0].Body != wantBody {
				t.Errorf("release body %s, want %s", rel[0].Body, wantBody)
			}
			if got := rel[0].Header.Get("Authorization"); got != "Bearer bk" {
				t.Errorf("release Authorization %q, want the backend key", got)
			}
			if got := rel[0].Header.Get("X-Request-Id"); got != "rel-1" {
				t.Errorf("release X-Request-Id %q", got)
			}
		})
	}

	t.Run("a decode that answers does not trigger a release", func(t *testing.T) {
		pre := newFake(t, prefillWithRelease)
		dec := newFake(t, decodeJSON)
		p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		p.bg.Wait()
		if n := len(releases(pre)); n != 0 {
			t.Errorf("prefill got %d releases, want 0", n)
		}
	})

	t.Run("a prefill without the route (vLLM) is counted as not_found", func(t *testing.T) {
		pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			if r.URL.Path != "/v1/completions" {
				http.NotFound(w, r)
				return
			}
			prefillOK(w, r, body)
		})
		dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			http.Error(w, "no", http.StatusBadRequest)
		})
		p, url := startProxy(t, Config{Fallback: true, ReleaseTimeout: time.Second}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		p.bg.Wait()
		if got := metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": releaseDecodeRefused, "result": releaseNotFound}); got != 1 {
			t.Errorf("kv_releases_total{decode_refused,not_found} = %v, want 1", got)
		}
	})
}
