package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
)

const wantPrefillKV = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

func TestLegBodies(t *testing.T) {
	tests := []struct {
		name        string
		path        string
		client      string
		wantPrefill string
		wantDecode  string
	}{
		{
			name:        "a non-streaming completion keeps unknown fields and number spellings on both legs",
			path:        "/v1/completions",
			client:      `{"model":"m","prompt":"Once upon","max_tokens":16,"temperature":0.70,"vendor_x":{"a":[1, 2.50]},"seed":1e3}`,
			wantPrefill: `{"model":"m","prompt":"Once upon","max_tokens":1,"temperature":0.70,"vendor_x":{"a":[1, 2.50]},"seed":1e3,"stream":false,` + wantPrefillKV + `}`,
			wantDecode:  `{"model":"m","prompt":"Once upon","max_tokens":16,"temperature":0.70,"vendor_x":{"a":[1, 2.50]},"seed":1e3,"kv_transfer_params":` + testKV + `}`,
		},
		{
			name:        "a streaming completion with stream_options and min_tokens loses them on prefill only",
			path:        "/v1/completions",
			client:      `{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true},"min_tokens":4,"max_tokens":8}`,
			wantPrefill: `{"model":"m","prompt":[1,2,3],"stream":false,"max_tokens":1,` + wantPrefillKV + `}`,
			wantDecode:  `{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true},"min_tokens":4,"max_tokens":8,"kv_transfer_params":` + testKV + `}`,
		},
		{
			name:        "a chat request without max_tokens gets max_tokens 1 on prefill and none on decode",
			path:        "/v1/chat/completions",
			client:      `{"model":"m","messages":[{"role":"user","content":"hi \u00e9"}]}`,
			wantPrefill: `{"model":"m","messages":[{"role":"user","content":"hi \u00e9"}],"stream":false,"max_tokens":1,` + wantPrefillKV + `}`,
			wantDecode:  `{"model":"m","messages":[{"role":"user","content":"hi \u00e9"}],"kv_transfer_params":` + testKV + `}`,
		},
		{
			name:        "a streaming chat request with max_completion_tokens and min_completion_tokens",
			path:        "/v1/chat/completions",
			client:      `{"messages":[],"model":"m","stream":true,"max_completion_tokens":32,"min_completion_tokens":2,"min_tokens":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`,
			wantPrefill: `{"messages":[],"model":"m","stream":false,"max_completion_tokens":1,"max_tokens":1,` + wantPrefillKV + `}`,
			wantDecode:  `{"messages":[],"model":"m","stream":true,"max_completion_tokens":32,"min_completion_tokens":2,"min_tokens":1,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"kv_transfer_params":` + testKV + `}`,
		},
		{
			name:        "kv_transfer_params sent by the client are replaced in place on both legs",
			path:        "/v1/completions",
			client:      `{"kv_transfer_params":{"do_remote_prefill":true},"prompt":"x","max_tokens":2}`,
			wantPrefill: `{` + wantPrefillKV + `,"prompt":"x","max_tokens":1,"stream":false}`,
			wantDecode:  `{"kv_transfer_params":` + testKV + `,"prompt":"x","max_tokens":2}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			resp, _ := post(t, url, tt.path, tt.client, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			if got := resp.Header.Get(HeaderPD); got != "remote" {
				t.Errorf("%s = %q, want remote", HeaderPD, got)
			}
			pr, dr := pre.requests(), dec.requests()
			if len(pr) != 1 || len(dr) != 1 {
				t.Fatalf("prefill got %d requests, decode %d; want 1 each", len(pr), len(dr))
			}
			if pr[0].Path != tt.path || dr[0].Path != tt.path {
				t.Errorf("paths: prefill %s, decode %s; want %s", pr[0].Path, dr[0].Path, tt.path)
			}
			if diff := cmp.Diff(tt.wantPrefill, pr[0].Body); diff != "" {
				t.Errorf("prefill body (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDecode, dr[0].Body); diff != "" {
				t.Errorf("decode body (-want +got):\n%s", diff)
			}
			for _, r := range append(pr, dr...) {
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("leg Content-Type %q, want application/json", ct)
				}
			}
		})
	}
}

func TestDecodeAnswerRelayed(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("X-Engine", "d0")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, `{"any":"thing"}`)
	})
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	got := map[string]string{
		"status":       resp.Status,
		"content-type": resp.Header.Get("Content-Type"),
		"x-engine":     resp.Header.Get("X-Engine"),
		"body":         body,
	}
	want := map[string]string{
		"status":       "418 I'm a teapot",
		"content-type": "application/json; charset=utf-8",
		"x-engine":     "d0",
		"body":         `{"any":"thing"}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("relayed answer (-want +got):\n%s", diff)
	}
}

func TestStreamingRelayChunkByChunk(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"text\":\"Once\"}]}\n\n",
		"data: {\"choices\":[{\"text\":\" upon\"}]}\n\n",
		"data: [DONE]\n\n",
	}
	ack := make(chan struct{})
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
			// The next event is written only once the client has seen
			// this one: a proxy that buffered would stall the test.
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			}
		}
	})
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q, want text/event-stream", ct)
	}
	br := bufio.NewReader(resp.Body)
	for i, want := range events {
		var got strings.Builder
		for !strings.HasSuffix(got.String(), "\n\n") {
			line, err := br.ReadString('\n')
			got.WriteString(line)
			if err != nil {
				t.Fatalf("event %d: %v (got %q so far)", i, err, got.String())
			}
		}
		if got.String() != want {
			t.Errorf("event %d = %q, want %q", i, got.String(), want)
		}
		ack <- struct{}{}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("data after [DONE]: %q", rest)
	}
}

func TestFallback(t *testing.T) {
	const client = `{"model":"m","prompt":"hi","max_tokens":4,"stream":false}`
	tests := []struct {
		name       string
		prefill    func(w http.ResponseWriter, r *http.Request, body []byte)
		unhealthy  bool
		wantReason string
		wantPD     string
	}{
		{
			name: "a prefill that drops the connection",
			prefill: func(w http.ResponseWriter, r *http.Request, body []byte) {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			},
			wantReason: reasonUnreachable,
			wantPD:     "fallback; reason=prefill_unreachable",
		},
		{
			name: "a prefill answering 503",
			prefill: func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, "overloaded", http.StatusServiceUnavailable)
			},
			wantReason: reasonServerError,
			wantPD:     "fallback; reason=prefill_5xx; status=503",
		},
		{
			name: "a prefill slower than the timeout",
			prefill: func(w http.ResponseWriter, r *http.Request, body []byte) {
				<-r.Context().Done()
			},
			wantReason: reasonTimeout,
			wantPD:     "fallback; reason=prefill_timeout",
		},
		{
			name: "a prefill answering without kv_transfer_params",
			prefill: func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, `{"choices":[{"text":"x"}],"kv_transfer_params":null}`)
			},
			wantReason: reasonNoKVParams,
			wantPD:     "fallback; reason=prefill_no_kv_params",
		},
		{
			name: "a prefill answering something that is not JSON",
			prefill: func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, `<html>gateway</html>`)
			},
			wantReason: reasonBadResponse,
			wantPD:     "fallback; reason=prefill_bad_response",
		},
		{
			name:       "no healthy prefill",
			prefill:    prefillOK,
			unhealthy:  true,
			wantReason: reasonNoPrefill,
			wantPD:     "fallback; reason=no_healthy_prefill",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, tt.prefill)
			if tt.unhealthy {
				pre.health.Store(http.StatusServiceUnavailable)
			}
			dec := newFake(t, decodeJSON)
			p, url := startProxy(t, Config{Fallback: true, Timeout: 300 * time.Millisecond}, []*fakeEngine{pre}, []*fakeEngine{dec})
			resp, body := post(t, url, "/v1/completions", client, nil)
			if resp.StatusCode != http.StatusOK || body != `{"id":"cmpl-2","choices":[{"text":"hello"}]}` {
				t.Errorf("answer %d %q, want decode's 200 answer", resp.StatusCode, body)
			}
			if got := resp.Header.Get(HeaderPD); got != tt.wantPD {
				t.Errorf("%s = %q, want %q", HeaderPD, got, tt.wantPD)
			}
			dr := dec.requests()
			if len(dr) != 1 || dr[0].Body != client {
				t.Errorf("decode got %+v, want the client's body verbatim", dr)
			}
			for _, reason := range fallbackReasons {
				want := 0.0
				if reason == tt.wantReason {
					want = 1
				}
				if got := metricValue(t, p, "tandem:proxy_fallbacks_total", map[string]string{"reason": reason}); got != want {
					t.Errorf("fallbacks_total{reason=%s} = %v, want %v", reason, got, want)
				}
			}
			if got := metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"path": "/v1/completions", "outcome": outcomeFallback}); got != 1 {
				t.Errorf("requests_total{outcome=fallback} = %v, want 1", got)
			}
		})
	}
}

func TestFallbackDisabled(t *testing.T) {
	tests := []struct {
		name       string
		prefill    func(w http.ResponseWriter, r *http.Request, body []byte)
		unhealthy  bool
		wantStatus int
		wantPD     string
	}{
		{"a prefill 5xx becomes 502", func(w http.ResponseWriter, r *http.Request, body []byte) {
			http.Error(w, "boom", http.StatusInternalServerError)
		}, false, http.StatusBadGateway, "failed; reason=prefill_5xx; status=500"},
		{"a prefill timeout becomes 504", func(w http.ResponseWriter, r *http.Request, body []byte) {
			<-r.Context().Done()
		}, false, http.StatusGatewayTimeout, "failed; reason=prefill_timeout"},
		{"no healthy prefill becomes 503", prefillOK, true, http.StatusServiceUnavailable, "failed; reason=no_healthy_prefill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, tt.prefill)
			if tt.unhealthy {
				pre.health.Store(http.StatusServiceUnavailable)
			}
			dec := newFake(t, decodeJSON)
			p, url := startProxy(t, Config{Fallback: false, Timeout: 300 * time.Millisecond}, []*fakeEngine{pre}, []*fakeEngine{dec})
			resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if got := resp.Header.Get(HeaderPD); got != tt.wantPD {
				t.Errorf("%s = %q, want %q", HeaderPD, got, tt.wantPD)
			}
			checkOpenAIError(t, body, tt.wantStatus)
			if n := len(dec.requests()); n != 0 {
				t.Errorf("decode got %d requests, want 0", n)
			}
			if got := metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomePrefillFailed}); got != 1 {
				t.Errorf("requests_total{outcome=prefill_failed} = %v, want 1", got)
			}
		})
	}
}

func TestPrefill4xxRelayed(t *testing.T) {
	const errBody = `{"error":{"message":"prompt too long","type":"BadRequestError","param":null,"code":400}}`
	pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, errBody)
	})
	dec := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, body := post(t, url, "/v1/chat/completions", `{"messages":[]}`, nil)
	if resp.StatusCode != http.StatusBadRequest || body != errBody {
		t.Errorf("got %d %q, want 400 %q", resp.StatusCode, body, errBody)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if got := resp.Header.Get(HeaderPD); got != "prefill-rejected" {
		t.Errorf("%s = %q, want prefill-rejected", HeaderPD, got)
	}
	if n := len(dec.requests()); n != 0 {
		t.Errorf("decode got %d requests, want 0", n)
	}
	if got := metricValue(t, p, "tandem:proxy_fallbacks_total", map[string]string{}); got != 0 {
		t.Errorf("a 4xx counted as a fallback")
	}
}

func TestRequestID(t *testing.T) {
	tests := []struct {
		name   string
		sent   string
		verify func(t *testing.T, id string)
	}{
		{"the client's id is used on both legs and echoed", "client-id-42", func(t *testing.T, id string) {
			if id != "client-id-42" {
				t.Errorf("id %q, want client-id-42", id)
			}
		}},
		{"without one a UUID is made, used on both legs and echoed", "", func(t *testing.T, id string) {
			if _, err := uuid.Parse(id); err != nil {
				t.Errorf("id %q is not a UUID: %v", id, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			h := http.Header{}
			if tt.sent != "" {
				h.Set("X-Request-Id", tt.sent)
			}
			h.Set("Authorization", "Bearer k")
			resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, h)
			echoed := resp.Header.Get("X-Request-Id")
			tt.verify(t, echoed)
			for _, leg := range []struct {
				name string
				f    *fakeEngine
			}{{"prefill", pre}, {"decode", dec}} {
				r := leg.f.requests()
				if len(r) != 1 {
					t.Fatalf("%s got %d requests", leg.name, len(r))
				}
				if got := r[0].Header.Values("X-Request-Id"); len(got) != 1 || got[0] != echoed {
					t.Errorf("%s leg X-Request-Id %q, want [%q]", leg.name, got, echoed)
				}
				if got := r[0].Header.Get("Authorization"); got != "Bearer k" {
					t.Errorf("%s leg Authorization %q, want it forwarded", leg.name, got)
				}
			}
		})
	}
}

func TestRoundRobinOverHealthyBackends(t *testing.T) {
	tests := []struct {
		name        string
		unhealthyP  int // index of an unhealthy prefill, or -1
		wantPrefill []int
		wantDecode  []int
	}{
		{"all healthy: each pool in turn", -1, []int{0, 1, 2, 0, 1, 2}, []int{0, 1, 0, 1, 0, 1}},
		{"an unhealthy prefill is skipped", 1, []int{0, 2, 0, 2, 0, 2}, []int{0, 1, 0, 1, 0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pre, dec []*fakeEngine
			for range 3 {
				pre = append(pre, newFake(t, prefillOK))
			}
			for range 2 {
				dec = append(dec, newFake(t, decodeJSON))
			}
			if tt.unhealthyP >= 0 {
				pre[tt.unhealthyP].health.Store(http.StatusInternalServerError)
			}
			_, url := startProxy(t, Config{Fallback: true}, pre, dec)
			var gotP, gotD []int
			for i := range len(tt.wantPrefill) {
				id := fmt.Sprintf("req-%d", i)
				resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {id}})
				if resp.Header.Get(HeaderPD) != "remote" {
					t.Fatalf("request %d not remote: %s", i, resp.Header.Get(HeaderPD))
				}
				gotP = append(gotP, whichGot(pre, id))
				gotD = append(gotD, whichGot(dec, id))
			}
			if diff := cmp.Diff(tt.wantPrefill, gotP); diff != "" {
				t.Errorf("prefill order (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDecode, gotD); diff != "" {
				t.Errorf("decode order (-want +got):\n%s", diff)
			}
		})
	}
}

// whichGot returns the index of the engine that received the request with
// the given X-Request-Id, or -1.
func whichGot(engines []*fakeEngine, id string) int {
	for i, e := range engines {
		for _, r := range e.requests() {
			if r.Header.Get("X-Request-Id") == id && r.Path != "/tandem/kv/release" {
				return i
			}
		}
	}
	return -1
}
