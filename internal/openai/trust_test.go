package openai

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

func TestAPIKeyOnARealEngine(t *testing.T) {
	const key = "sk-test-0123"
	s := startStories(t, "stories", func(c *Config) { c.APIKey = key })
	const body = `{"model":"stories","prompt":"Once upon a time","max_tokens":4,"temperature":0}`
	t.Setenv("OPENAI_API_KEY", key)
	cases := []struct {
		name   string
		method string
		path   string
		auth   string
		want   int
	}{
		{"a completion without a key is a 401", "POST", "/v1/completions", "", 401},
		{"a wrong key is a 401", "POST", "/v1/completions", "Bearer sk-test-0124", 401},
		{"a key prefix is a 401", "POST", "/v1/completions", "Bearer sk-test", 401},
		{"another scheme is a 401", "POST", "/v1/completions", "Basic " + key, 401},
		{"the right key is served", "POST", "/v1/completions", "Bearer " + key, 200},
		{"vLLM's toy proxy header, Bearer $OPENAI_API_KEY, is served", "POST", "/v1/completions", "Bearer " + os.Getenv("OPENAI_API_KEY"), 200},
		{"a lower-case scheme is served", "POST", "/v1/completions", "bearer " + key, 200},
		{"/health is open", "GET", "/health", "", 200},
		{"/livez is open", "GET", "/livez", "", 200},
		{"/metrics is open", "GET", "/metrics", "", 200},
		{"/v1/models needs the key", "GET", "/v1/models", "", 401},
		{"/tokenize needs the key", "POST", "/tokenize", "", 401},
		{"/version needs the key", "GET", "/version", "", 401},
		{"the KV release route needs the key", "POST", KVReleasePath, "", 401},
		{"an unknown path is a 401, not a 404, without the key", "GET", "/admin", "", 401},
		{"an unknown path is a 404 with the key", "GET", "/admin", "Bearer " + key, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, s.url+c.path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e ErrorBody
			dec := decodeJSONBody(resp, &e)
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
			if c.want == 401 {
				if dec != nil || e.Error.Type != TypeUnauthorized || e.Error.Code != 401 || e.Error.Message == "" {
					t.Errorf("401 body %+v (%v): want an OpenAI-shaped AuthenticationError", e, dec)
				}
				if strings.Contains(e.Error.Message, "sk-") {
					t.Errorf("the 401 repeats a key: %q", e.Error.Message)
				}
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Error("no WWW-Authenticate challenge")
				}
			}
		})
	}
}

func decodeJSONBody(resp *http.Response, v any) error {
	if err := DecodeBody(&http.Request{Body: resp.Body}, 1<<20, v); err != nil {
		return err
	}
	return nil
}

func TestBadRequestIDsAreRefused(t *testing.T) {
	b := newFakeBackend(echoScript("ok"))
	_, ts := newTestServer(t, b, nil)
	for _, id := range []string{"has space", "tab\tin", "caf\u00e9", strings.Repeat("x", MaxRequestIDLen+1)} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			t.Run(fmt.Sprintf("%q on %s", id[:min(len(id), 12)], path), func(t *testing.T) {
				body := `{"model":"m","prompt":"a","max_tokens":1}`
				if path == "/v1/chat/completions" {
					body = `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1}`
				}
				before := len(b.requests())
				resp, raw := post(t, ts.URL+path, body, map[string]string{"X-Request-Id": id})
				if resp.StatusCode != 400 || !strings.Contains(string(raw), `"param":"X-Request-Id"`) {
					t.Errorf("got %d %s, want a 400 naming X-Request-Id", resp.StatusCode, raw)
				}
				if resp.Header.Get("X-Request-Id") != "" {
					t.Errorf("a refused id was echoed")
				}
				if len(b.requests()) != before {
					t.Errorf("the engine got the request")
				}
			})
		}
	}
	t.Run("printable ASCII up to the limit is accepted", func(t *testing.T) {
		id := strings.Repeat("!~", MaxRequestIDLen/2)
		resp, raw := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, map[string]string{"X-Request-Id": id})
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
			t.Errorf("got %d %s", resp.StatusCode, raw)
		}
	})
}

// fakeReleaser records ReleaseKV calls and answers with err.
type fakeReleaser struct {
	err error
	mu  sync.Mutex
	got []kvparams.Params
}

func (f *fakeReleaser) ReleaseKV(kv kvparams.Params) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, kv)
	return f.err
}

func TestKVReleaseRoute(t *testing.T) {
	const params = `{"remote_engine_id":"p0","remote_request_id":"r-1","remote_block_ids":[[1,2]],"kv_signature":"abc"}`
	cases := []struct {
		name     string
		releaser *fakeReleaser
		none     bool
		body     string
		want     int
		wantBody string // substring
		calls    int
	}{
		{"a release the connector accepts is a 200", &fakeReleaser{}, false, `{"kv_transfer_params":` + params + `}`, 200, `{"released":true}`, 1},
		{"params the connector refuses are a 400", &fakeReleaser{err: fmt.Errorf("release: %w", &engine.InvalidRequestError{Message: "not signed by this engine"})}, false,
			`{"kv_transfer_params":` + params + `}`, 400, `"message":"not signed by this engine","type":"BadRequestError","param":"kv_transfer_params"`, 1},
		{"nothing held is a 404 that names no detail", &fakeReleaser{err: errors.New("r-1 not held: expired at 12:00")}, false,
			`{"kv_transfer_params":` + params + `}`, 404, `"type":"NotFoundError"`, 1},
		{"an engine without a connector answers 404", nil, true, `{"kv_transfer_params":` + params + `}`, 404, `holds no KV`, 0},
		{"a body without params is a 400", &fakeReleaser{}, false, `{}`, 400, `"param":"kv_transfer_params"`, 0},
		{"params that are not an object are a 400", &fakeReleaser{}, false, `{"kv_transfer_params":[1]}`, 400, `"param":"kv_transfer_params"`, 0},
		{"a malformed field is a 400 that names it", &fakeReleaser{}, false, `{"kv_transfer_params":{"remote_port":"80"}}`, 400, `remote_port must be a TCP port`, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, ts := newTestServer(t, newFakeBackend(echoScript("x")), func(cfg *Config) {
				if !c.none {
					cfg.KVReleaser = c.releaser
				}
			})
			resp, raw := post(t, ts.URL+KVReleasePath, c.body, nil)
			if resp.StatusCode != c.want || !strings.Contains(string(raw), c.wantBody) {
				t.Errorf("got %d %s, want %d with %s", resp.StatusCode, raw, c.want, c.wantBody)
			}
			if strings.Contains(string(raw), "expired at") {
				t.Errorf("the 404 tells the client what the engine knows: %s", raw)
			}
			if c.releaser != nil && len(c.releaser.got) != c.calls {
				t.Errorf("ReleaseKV called %d times, want %d", len(c.releaser.got), c.calls)
			}
		})
	}
	t.Run("GET is a 405", func(t *testing.T) {
		_, ts := newTestServer(t, newFakeBackend(echoScript("x")), func(cfg *Config) { cfg.KVReleaser = &fakeReleaser{} })
		resp, err := http.Get(ts.URL + KVReleasePath)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
}
