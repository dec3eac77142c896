package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// checkOpenAIError fails unless body is {"error": {message, type, param,
// code}} with code == status and a non-empty message.
func checkOpenAIError(t *testing.T, body string, status int) {
	t.Helper()
	var e struct {
		Error *struct {
			Message *string         `json:"message"`
			Type    *string         `json:"type"`
			Param   json.RawMessage `json:"param"`
			Code    *int            `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
		t.Fatalf("body %q is not an OpenAI error: %v", body, err)
	}
	if e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type == nil || e.Error.Param == nil || e.Error.Code == nil || *e.Error.Code != status {
		t.Errorf("error body %s: want message, type, param and code %d", body, status)
	}
}

func TestProxyRejects(t *testing.T) {
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
	}{
		{"a body that is not JSON", http.MethodPost, "/v1/completions", `{"prompt":`, http.StatusBadRequest},
		{"a JSON body that is not an object", http.MethodPost, "/v1/completions", `["prompt"]`, http.StatusBadRequest},
		{"a body with data after the object", http.MethodPost, "/v1/completions", `{"prompt":"x"} {}`, http.StatusBadRequest},
		{"a body over the size limit", http.MethodPost, "/v1/chat/completions", `{"prompt":"` + strings.Repeat("a", 2000) + `"}`, http.StatusRequestEntityTooLarge},
		{"a GET on a generation path", http.MethodGet, "/v1/completions", ``, http.StatusMethodNotAllowed},
		{"a path the proxy does not serve", http.MethodPost, "/v1/responses", `{}`, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, Config{Fallback: true, MaxBodyBytes: 1024}, []*fakeEngine{pre}, []*fakeEngine{dec})
			req, _ := http.NewRequest(tt.method, url+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, tt.wantStatus, b)
			}
			checkOpenAIError(t, string(b), tt.wantStatus)
			if n := len(pre.requests()) + len(dec.requests()); n != 0 {
				t.Errorf("backends got %d requests, want 0", n)
			}
		})
	}
}

func TestNoHealthyDecodeIs503WithoutTouchingPrefill(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	dec.health.Store(http.StatusServiceUnavailable)
	p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", resp.StatusCode)
	}
	checkOpenAIError(t, body, http.StatusServiceUnavailable)
	if n := len(pre.requests()); n != 0 {
		t.Errorf("prefill got %d requests, want 0: its KV would be stranded", n)
	}
	if got := metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeNoBackend}); got != 1 {
		t.Errorf("requests_total{outcome=no_backend} = %v, want 1", got)
	}
}

func TestUnreachableDecodeIs502AndMarkedDown(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	dec.srv.Close() // healthy at the last check, gone now
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", resp.StatusCode)
	}
	checkOpenAIError(t, body, http.StatusBadGateway)
	if p.decode.anyHealthy() {
		t.Error("the unreachable decode is still marked healthy")
	}
	resp, _ = post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("next request: status %d, want 503", resp.StatusCode)
	}
}

func TestDecodeIdleTimeoutCutsTheStream(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // then silence
	})
	p, url := startProxy(t, Config{Fallback: true, Timeout: 200 * time.Millisecond}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("the cut stream ended cleanly after %q; the client must see an error", b)
	}
	if string(b) != "data: {}\n\n" {
		t.Errorf("relayed %q before the cut, want the first event", b)
	}
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeStreamBroken}) == 1
	})
}

func TestClientDisconnectCancelsLegs(t *testing.T) {
	tests := []struct {
		name string
		// blockIn says which leg blocks until its request is canceled.
		blockIn string
	}{
		{"a client leaving during the stream cancels the decode leg", "decode"},
		{"a client leaving during prefill cancels the prefill leg and skips decode", "prefill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			canceled := make(chan struct{})
			started := make(chan struct{})
			block := func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
				close(started)
				select {
				case <-r.Context().Done():
					close(canceled)
				case <-time.After(10 * time.Second):
				}
			}
			pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tt.blockIn == "prefill" {
					block(w, r)
					return
				}
				prefillOK(w, r, body)
			})
			dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tt.blockIn == "decode" {
					block(w, r)
					return
				}
				decodeJSON(w, r, body)
			})
			p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
			req.Header.Set("Content-Type", "application/json")
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			select {
			case <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("the blocking leg never started")
			}
			cancel()
			select {
			case <-canceled:
			case <-time.After(5 * time.Second):
				t.Fatalf("the %s leg was not canceled when the client left", tt.blockIn)
			}
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("client error %v, want context.Canceled", err)
			}
			if tt.blockIn == "prefill" {
				if n := len(dec.requests()); n != 0 {
					t.Errorf("decode got %d requests after the client left, want 0", n)
				}
			}
			waitFor(t, func() bool {
				return metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeClientCanceled}) == 1
			})
			waitFor(t, func() bool {
				return metricValue(t, p, "tandem:proxy_backend_in_flight", map[string]string{"role": tt.blockIn}) == 0
			})
		})
	}
}

func TestHealth(t *testing.T) {
	tests := []struct {
		name       string
		prefillOK  []bool
		decodeOK   []bool
		wantStatus int
		want       string
		fallback   bool
	}{
		{"one healthy of each role is enough", []bool{false, true}, []bool{true}, http.StatusOK, "ok", false},
		{"no healthy prefill is unavailable", []bool{false}, []bool{true}, http.StatusServiceUnavailable, "unavailable", false},
		{"no healthy prefill is unavailable, with fallback too", []bool{false}, []bool{true}, http.StatusServiceUnavailable, "unavailable", true},
		{"no healthy decode is unavailable", []bool{true}, []bool{false, false}, http.StatusServiceUnavailable, "unavailable", false},
		// Decodes only, with fallback: every request is served on a decode
		// (the proxy said 503 while it served them).
		{"no prefill pool, a healthy decode, fallback: ok", nil, []bool{true}, http.StatusOK, "ok", true},
		{"no prefill pool, no healthy decode: unavailable", nil, []bool{false}, http.StatusServiceUnavailable, "unavailable", true},
		{"no prefill pool without fallback: unavailable", nil, []bool{true}, http.StatusServiceUnavailable, "unavailable", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mk := func(oks []bool, h func(http.ResponseWriter, *http.Request, []byte)) []*fakeEngine {
				var out []*fakeEngine
				for _, ok := range oks {
					f := newFake(t, h)
					if !ok {
						f.health.Store(http.StatusServiceUnavailable)
					}
					out = append(out, f)
				}
				return out
			}
			pre, dec := mk(tt.prefillOK, prefillOK), mk(tt.decodeOK, decodeJSON)
			// A pool may be empty only when backends come and go at run
			// time (a backends file, discovery).
			_, url := startProxy(t, Config{Fallback: tt.fallback, DynamicBackends: tt.prefillOK == nil}, pre, dec)
			resp, err := http.Get(url + "/health")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got healthBody
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus || got.Status != tt.want {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, got.Status, tt.wantStatus, tt.want)
			}
			type state struct {
				URL     string
				Healthy bool
			}
			summary := func(bs []backendState) []state {
				var out []state
				for _, b := range bs {
					out = append(out, state{b.URL, b.Healthy})
				}
				return out
			}
			expect := func(fs []*fakeEngine, oks []bool) []state {
				var out []state
				for i, f := range fs {
					out = append(out, state{f.URL(), oks[i]})
				}
				return out
			}
			if diff := cmp.Diff(expect(pre, tt.prefillOK), summary(got.Prefill)); diff != "" {
				t.Errorf("prefill states (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(expect(dec, tt.decodeOK), summary(got.Decode)); diff != "" {
				t.Errorf("decode states (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServeChecksHealthInTheBackground(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	dec.health.Store(http.StatusServiceUnavailable) // still loading
	p, err := New(Config{
		Prefill: []string{pre.URL()}, Decode: []string{dec.URL()},
		HealthInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	status := func() int {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, func() bool { return status() == http.StatusServiceUnavailable })
	dec.health.Store(http.StatusOK)
	waitFor(t, func() bool { return status() == http.StatusOK })
	pre.health.Store(http.StatusInternalServerError)
	waitFor(t, func() bool { return status() == http.StatusServiceUnavailable })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context was canceled")
	}
}

func TestModelsFromDecode(t *testing.T) {
	const models = `{"object":"list","data":[{"id":"tiny","object":"model"}]}`
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	dec.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, models)
		default:
			http.NotFound(w, r)
		}
	})
	_, url := startProxy(t, Config{}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != models {
		t.Errorf("got %d %s, want 200 %s", resp.StatusCode, b, models)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	_, url := startProxy(t, Config{}, []*fakeEngine{pre}, []*fakeEngine{dec})
	post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		"tandem:proxy_prefill_seconds_count 1",
		"tandem:proxy_decode_ttfb_seconds_count 1",
		"tandem:proxy_request_seconds_count 1",
		`tandem:proxy_requests_total{outcome="remote",path="/v1/completions"} 1`,
		`tandem:proxy_fallbacks_total{reason="prefill_timeout"} 0`,
		`tandem:proxy_backend_in_flight{backend="` + dec.URL() + `",role="decode"} 0`,
		`tandem:proxy_backend_healthy{backend="` + pre.URL() + `",role="prefill"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no prefill", Config{Decode: []string{"127.0.0.1:1"}}, "no prefill backends"},
		{"no decode", Config{Prefill: []string{"127.0.0.1:1"}}, "no decode backends"},
		{"a bad scheme", Config{Prefill: []string{"ftp://h:1"}, Decode: []string{"h:2"}}, `scheme "ftp"`},
		{"a URL listed twice", Config{Prefill: []string{"h:1", "http://h:1/"}, Decode: []string{"h:2"}}, "listed twice"},
		{"an unknown policy", Config{Prefill: []string{"h:1"}, Decode: []string{"h:2"}, Policy: "psychic"}, `unknown policy "psychic"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestClientLeavingAfterDoneIsASuccess(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
		w.(http.Flusher).Flush()
		// Hold the response open: the client hangs up after [DONE] before
		// the proxy sees the decode's EOF.
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before [DONE]: %v", err)
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			break
		}
	}
	resp.Body.Close()
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeRemote}) == 1
	})
	if got := metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeClientCanceled}); got != 0 {
		t.Errorf("a stream delivered through [DONE] counted as client_canceled (%v)", got)
	}
}
