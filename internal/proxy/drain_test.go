package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// drainingEngine answers generation requests like a draining Tandem engine
// (SIGTERM, or a pod on its way out): 503 before reading anything, and its
// /health 503 too once the proxy checks again.
func drainingEngine(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, `{"error":{"message":"the server is shutting down; retry on another instance","type":"server_error","code":503}}`)
}

// decodeSSE streams three events, the last [DONE].
func decodeSSE(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range []string{`data: {"choices":[{"text":"hel"}]}`, `data: {"choices":[{"text":"lo"}]}`, "data: [DONE]"} {
		io.WriteString(w, e+"\n\n")
		w.(http.Flusher).Flush()
	}
}

func TestDecodeAnswering503IsRetriedOnAnother(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			pre := newFake(t, prefillOK)
			good := newFake(t, decodeJSON)
			if stream {
				good = newFake(t, decodeSSE)
			}
			draining := newFake(t, drainingEngine)
			// Both decodes passed their last health check: the draining
			// one turned unready after it, as a pod does between two checks.
			p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{draining, good})
			body := fmt.Sprintf(`{"prompt":"x","stream":%v}`, stream)
			for i := range 4 {
				resp, got := post(t, url, "/v1/completions", body, http.Header{"X-Request-Id": {fmt.Sprint("r", i)}})
				if resp.StatusCode != http.StatusOK || !strings.Contains(got, "hel") {
					t.Fatalf("request %d: %d %q, want the other decode's answer", i, resp.StatusCode, got)
				}
				if pd := resp.Header.Get(HeaderPD); pd != "remote" {
					t.Errorf("request %d: %s = %q, want remote", i, HeaderPD, pd)
				}
			}
			if n := len(draining.requests()); n != 1 {
				t.Errorf("the draining decode got %d requests, want 1: its 503 should mark it down until a health check passes", n)
			}
			// The retry carried the prefill's params: the KV is pulled by the
			// second decode, not released.
			for i, r := range good.requests() {
				if !strings.Contains(r.Body, testKV) {
					t.Errorf("request %d reached the second decode without the prefill's kv_transfer_params: %s", i, r.Body)
				}
			}
			for _, r := range pre.requests() {
				if r.Path == kvReleasePath {
					t.Error("the prefill's KV was released although a decode took the request")
				}
			}
			if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "decode", "reason": "decode_unavailable"}); n != 1 {
				t.Errorf("tandem:proxy_leg_retries_total{decode_unavailable} = %v, want 1", n)
			}
		})
	}
}

func TestDecode503WithNoOtherDecodeIsRelayed(t *testing.T) {
	pre := newFake(t, prefillOK)
	draining := newFake(t, drainingEngine)
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{draining})
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Errorf("only decode draining: %d %q, want its 503 relayed", resp.StatusCode, body)
	}
	// The decode never read the KV: the prefill is told to free it.
	waitFor(t, func() bool {
		for _, r := range pre.requests() {
			if r.Path == kvReleasePath {
				return true
			}
		}
		return false
	})
}

func TestPrefillAnswering503IsRetriedOnAnother(t *testing.T) {
	draining := newFake(t, drainingEngine)
	good := newFake(t, prefillOK)
	dec := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{draining, good}, []*fakeEngine{dec})
	for i := range 4 {
		resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		if pd := resp.Header.Get(HeaderPD); resp.StatusCode != http.StatusOK || pd != "remote" {
			t.Fatalf("request %d: %d %s = %q, want 200 remote (retried on the other prefill)", i, resp.StatusCode, HeaderPD, pd)
		}
	}
	if n := len(draining.requests()); n != 1 {
		t.Errorf("the draining prefill got %d requests, want 1: its 503 should mark it down", n)
	}
	if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "prefill", "reason": reasonServerError}); n != 1 {
		t.Errorf("prefill retries = %v, want 1", n)
	}
	if n := metricValue(t, p, "tandem:proxy_fallbacks_total", nil); n != 0 {
		t.Errorf("%v fallbacks, want none", n)
	}
}

// TestRemovedBackendFinishesItsRequests removes a decode from the set while
// it streams an answer: the stream completes, and new requests go to the
// decode that replaced it.
func TestRemovedBackendFinishesItsRequests(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	pre := newFake(t, prefillOK)
	old := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"hel\"}]}\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-finish
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"lo\"}]}\n\ndata: [DONE]\n\n")
	})
	next := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{old})

	type answer struct {
		status int
		body   string
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, string(b), err}
	}()
	<-started
	if err := p.SetBackends(roleDecode, []string{next.URL()}); err != nil {
		t.Fatal(err)
	}
	if l := p.decode.list(); len(l) != 1 || l[0].base != next.URL() {
		t.Fatalf("decode pool after the change: %v", urlsOf(p.decode))
	}
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {"after"}})
	if resp.StatusCode != http.StatusOK || whichGot([]*fakeEngine{old, next}, "after") != 1 {
		t.Errorf("a request after the removal: %d %q, want the new decode's answer", resp.StatusCode, body)
	}
	close(finish)
	a := <-done
	if a.err != nil || a.status != http.StatusOK || !strings.HasSuffix(a.body, "data: [DONE]\n\n") || !strings.Contains(a.body, `"lo"`) {
		t.Errorf("the stream in flight on the removed decode: %d %q %v, want it whole", a.status, a.body, a.err)
	}
}

// TestDecodeDrainedMidLoadLosesNoRequest runs a bounded load over two
// decodes and two prefills, drains one of each mid-load as a pod turned
// unready does (new requests 503, /health 503, requests in flight finish),
// then removes them from the set as discovery does on the unready event:
// every request succeeds.
func TestDecodeDrainedMidLoadLosesNoRequest(t *testing.T) {
	var draining atomic.Bool
	// drainable wraps an engine's handler: once draining, the engine
	// refuses new work with 503 and fails /health; what it has started it
	// finishes.
	drainable := func(ok func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
		return newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			if draining.Load() {
				drainingEngine(w, r, body)
				return
			}
			time.Sleep(2 * time.Millisecond) // a request in flight when the drain starts
			ok(w, r, body)
		})
	}
	slowSSE := func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}
	p0, p1 := drainable(prefillOK), newFake(t, prefillOK)
	d0, d1 := drainable(slowSSE), newFake(t, slowSSE)
	p, url := startProxy(t, Config{Fallback: false, ScrapeInterval: -1, HealthInterval: 20 * time.Millisecond},
		[]*fakeEngine{p0, p1}, []*fakeEngine{d0, d1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.runHealth(ctx)

	const clients, perClient = 8, 25
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	var errs sync.Map
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				n := sent.Add(1)
				if n == clients*perClient/3 {
					// The pod turns unready: the engines drain ...
					draining.Store(true)
					p0.health.Store(http.StatusServiceUnavailable)
					d0.health.Store(http.StatusServiceUnavailable)
				}
				if n == clients*perClient*2/3 {
					// ... and discovery sees the EndpointSlice change.
					_ = p.SetBackends(rolePrefill, []string{p1.URL()})
					_ = p.SetBackends(roleDecode, []string{d1.URL()})
				}
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
				if err != nil {
					failed.Add(1)
					errs.Store(fmt.Sprint(c, "/", i), err.Error())
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || resp.Header.Get(HeaderPD) != "remote" {
					failed.Add(1)
					errs.Store(fmt.Sprint(c, "/", i), fmt.Sprintf("%d %s %q %v", resp.StatusCode, resp.Header.Get(HeaderPD), b, err))
				}
			}
		})
	}
	wg.Wait()
	errs.Range(func(k, v any) bool { t.Errorf("request %v: %v", k, v); return true })
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed while a prefill and a decode drained", failed.Load(), sent.Load())
	}
	if len(d0.requests()) == 0 || len(p0.requests()) == 0 {
		t.Error("the drained engines served nothing before the drain: the test did not load them")
	}
	t.Logf("%d requests, 0 lost; retries: decode %v, prefill %v", sent.Load(),
		metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "decode"}),
		metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "prefill"}))
}
