package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// The proxy's half of the transfer contract (docs/kv-transfer.md, "The
// transfer contract"): every hold a prefill answers is released or pulled,
// and a retry never sends params that may be spent.

// prefillReleasing answers prefill legs as prefillOK does and the release
// route with 200, counting the releases of testKV it gets.
func prefillReleasing(releases *atomic.Int32) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == kvReleasePath {
			if strings.Contains(string(body), testKV) {
				releases.Add(1)
			}
			io.WriteString(w, `{"released":true}`)
			return
		}
		prefillOK(w, r, body)
	}
}

// diesAfterReading reads the leg (the engine has it, and may have pulled
// the KV) and closes the connection without a byte of answer, as a decode
// killed before its first token.
func diesAfterReading(w http.ResponseWriter, r *http.Request, body []byte) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// spentParams answers a leg carrying kv_transfer_params as a decode whose
// pull finds nothing held (the first decode's pull freed the blocks): 500;
// and a leg without them as decodeJSON does.
func spentParams(w http.ResponseWriter, r *http.Request, body []byte) {
	if strings.Contains(string(body), "kv_transfer_params") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"the request failed in the engine: pulling the prompt's KV from the prefill engine failed (not_held)","type":"server_error","code":500}}`)
		return
	}
	decodeJSON(w, r, body)
}

// firstThen is two decode engines: whichever gets the first decode leg
// serves it with first, every later leg is served by next.
func firstThen(t *testing.T, first, next func(w http.ResponseWriter, r *http.Request, body []byte)) ([]*fakeEngine, *atomic.Int32) {
	return firstThenOn(t, nil, first, next)
}

// firstThenOn is firstThen on the in-memory network mem (nil: loopback).
func firstThenOn(t *testing.T, mem *testutil.MemNet, first, next func(w http.ResponseWriter, r *http.Request, body []byte)) ([]*fakeEngine, *atomic.Int32) {
	var calls, firstIdx atomic.Int32
	engines := make([]*fakeEngine, 2)
	for i := range engines {
		engines[i] = newFakeOn(t, mem, func(w http.ResponseWriter, r *http.Request, body []byte) {
			if calls.Add(1) == 1 {
				firstIdx.Store(int32(i))
				first(w, r, body)
				return
			}
			next(w, r, body)
		})
	}
	return engines, &firstIdx
}

// TestDecodeRetryAfterTheLegWasSentGoesWithoutParams kills the decode that
// got the leg before its first byte: the retry on the other decode must not
// carry the prefill's params (the dead decode may have pulled them, which
// frees them on the prefill, and the retry would fail with not_held), but
// the client's body alone, said in X-Tandem-Pd; the prefill's hold is
// released; and the healthy decode is not blamed.
func TestDecodeRetryAfterTheLegWasSentGoesWithoutParams(t *testing.T) {
	var releases atomic.Int32
	pre := newFake(t, prefillReleasing(&releases))
	decodes, first := firstThen(t, diesAfterReading, spentParams)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, decodes)
	const client = `{"prompt":"x","max_tokens":3}`
	resp, body := post(t, url, "/v1/completions", client, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
		t.Fatalf("answer %d %s; want the retry's 200", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get(HeaderPD), "fallback; reason="+reasonDecodeRetry; got != want {
		t.Errorf("%s = %q, want %q", HeaderPD, got, want)
	}
	retry := decodes[1-first.Load()]
	if got := retry.requests(); len(got) != 1 || got[0].Body != client {
		t.Errorf("the retry's decode got %+v; want the client's body verbatim, without kv_transfer_params", got)
	}
	waitFor(t, func() bool { return releases.Load() == 1 })
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": releaseDecodeRetried, "result": releaseOK}) == 1
	})
	if n := metricValue(t, p, "tandem:proxy_fallbacks_total", map[string]string{"reason": reasonDecodeRetry}); n != 1 {
		t.Errorf("fallbacks_total{reason=%s} = %v, want 1", reasonDecodeRetry, n)
	}
	if b := backendOf(t, p, retry); !b.healthy.Load() {
		t.Error("the decode that served the retry was marked unhealthy")
	}
}

// TestDecodeRetryBefore503KeepsParams: a draining decode refuses with 503
// before reading any KV, so the retry still pulls the prefill's KV.
func TestDecodeRetryBefore503KeepsParams(t *testing.T) {
	pre := newFake(t, prefillOK)
	decodes, first := firstThen(t, drainingEngine, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, decodes)
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPD) != "remote" {
		t.Fatalf("answer %d %s %q; want the retry's 200 on the remote path", resp.StatusCode, body, resp.Header.Get(HeaderPD))
	}
	if got := decodes[1-first.Load()].requests(); len(got) != 1 || !strings.Contains(got[0].Body, testKV) {
		t.Errorf("the retry's decode got %+v; want the prefill's params", got)
	}
}

// TestDecodeErrorOnATransferLegIsNotCountedAgainstIt: a decode answering
// 5xx to legs carrying kv_transfer_params (a pull that failed: params
// spent or expired, a prefill gone) is not ejected by the circuit breaker;
// the same 5xx to legs without params still is.
func TestDecodeErrorOnATransferLegIsNotCountedAgainstIt(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"the request failed in the engine","type":"server_error","code":500}}`)
	})
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{pre}, []*fakeEngine{dec})
	for i := range breakerThreshold + 1 {
		if resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil); resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("request %d: %d %s; want the decode's 500 relayed (it stays healthy)", i, resp.StatusCode, body)
		}
	}
	b := backendOf(t, p, dec)
	if !b.healthy.Load() {
		t.Fatal("the decode was ejected for 500s to legs with kv_transfer_params")
	}
	// A batch prompt's leg carries no params: its 500s are the decode's.
	for range breakerThreshold {
		post(t, url, "/v1/completions", `{"prompt":["x","y"]}`, nil)
	}
	if b.healthy.Load() {
		t.Error("the decode answering 500 to legs without kv_transfer_params was not ejected")
	}
}

// TestGoneClientsPrefillAnswerIsReleased: the client leaves while the
// prefill computes; the prefill answers (a forward pass it began runs to
// its end) within the grace: the proxy releases the hold at once, and sends
// no decode leg.
func TestGoneClientsPrefillAnswerIsReleased(t *testing.T) {
	var releases atomic.Int32
	arrived := make(chan struct{})
	pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == kvReleasePath {
			prefillReleasing(&releases)(w, r, body)
			return
		}
		close(arrived)
		// The forward pass in progress ends 300ms later, or, when the
		// proxy drops the leg, the engine aborts it at the step's end:
		// either way it answers, holding the KV.
		select {
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
		}
		prefillOK(w, r, body)
	})
	dec := newFake(t, decodeJSON)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, CanceledPrefillGrace: 5 * time.Second}, []*fakeEngine{pre}, []*fakeEngine{dec})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	await(t, arrived, "the prefill leg")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want context.Canceled", err)
	}
	waitFor(t, func() bool { return releases.Load() == 1 })
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": releaseClientCanceled, "result": releaseOK}) == 1
	})
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeClientCanceled}) == 1
	})
	if n := len(dec.requests()); n != 0 {
		t.Errorf("decode got %d legs for a client that had left", n)
	}
}

// TestDecodeRetryAfterTheLegWasSentFailsWithFallbackOff: with Fallback off
// a remote leg is never turned into a local prefill: the request fails, and
// the prefill's hold is released.
func TestDecodeRetryAfterTheLegWasSentFailsWithFallbackOff(t *testing.T) {
	var releases atomic.Int32
	pre := newFake(t, prefillReleasing(&releases))
	decodes, first := firstThen(t, diesAfterReading, spentParams)
	_, url := startProxy(t, Config{Fallback: false, ScrapeInterval: -1}, []*fakeEngine{pre}, decodes)
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("answer %d %s, want 502", resp.StatusCode, body)
	}
	checkOpenAIError(t, body, http.StatusBadGateway)
	if n := len(decodes[1-first.Load()].requests()); n != 0 {
		t.Errorf("the other decode got %d legs; with Fallback off there is no local retry", n)
	}
	waitFor(t, func() bool { return releases.Load() == 1 })
}
