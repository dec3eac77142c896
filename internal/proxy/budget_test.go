package proxy

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestPrefillRetryGetsTheRemainingBudget: the first prefill attempt fails
// slowly (a 500 after 400ms), the retry on the other prefill engine hangs.
// The retry is given what is left of the leg's 800ms budget, not 800ms
// more, so the request falls back to the decode at about 800ms (it took
// 1,200ms when every attempt had a full Timeout of its own).
func TestPrefillRetryGetsTheRemainingBudget(t *testing.T) {
	const (
		budget   = 800 * time.Millisecond
		slowFail = 400 * time.Millisecond
	)
	var attempts atomic.Int32
	retryGot := make(chan time.Duration, 1) // the retry's deadline, as the engine sees it
	var start atomic.Int64
	leg := func(w http.ResponseWriter, r *http.Request, body []byte) {
		if attempts.Add(1) == 1 {
			time.Sleep(slowFail)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		// The retry: hang until the proxy gives up on it.
		select {
		case <-r.Context().Done():
			retryGot <- time.Since(time.Unix(0, start.Load()))
		case <-time.After(10 * time.Second):
		}
	}
	pre := []*fakeEngine{newFake(t, leg), newFake(t, leg)}
	dec := []*fakeEngine{newFake(t, decodeJSON)}
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, Timeout: budget}, pre, dec)

	start.Store(time.Now().UnixNano())
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	took := time.Since(time.Unix(0, start.Load()))
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPD) != "fallback; reason="+reasonTimeout {
		t.Fatalf("answer %d %s = %q (%s), want 200 and a fallback for the retry's timeout", resp.StatusCode, HeaderPD, resp.Header.Get(HeaderPD), body)
	}
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d prefill attempts, want 2 (one retry)", n)
	}
	if took >= budget+slowFail-100*time.Millisecond {
		t.Errorf("the request took %v: the retry had a fresh %v instead of the %v left", took, budget, budget-slowFail)
	}
	select {
	case at := <-retryGot:
		if at < budget-50*time.Millisecond {
			t.Errorf("the retry was cut at %v, before the budget's end at %v", at, budget)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the retry leg was never cancelled")
	}
	if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "prefill", "reason": reasonServerError}); n != 1 {
		t.Errorf("prefill retries{reason=prefill_5xx} = %v, want 1", n)
	}
}

// TestPrefillRetrySkippedWhenTheBudgetIsSpent: a first attempt that fails
// after the budget is over leaves nothing for a retry.
func TestPrefillRetrySkippedWhenTheBudgetIsSpent(t *testing.T) {
	var attempts atomic.Int32
	leg := func(w http.ResponseWriter, r *http.Request, body []byte) {
		attempts.Add(1)
		<-r.Context().Done() // no answer within the budget
	}
	pre := []*fakeEngine{newFake(t, leg), newFake(t, leg)}
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, Timeout: 200 * time.Millisecond}, pre, []*fakeEngine{newFake(t, decodeJSON)})
	resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if got := resp.Header.Get(HeaderPD); got != "fallback; reason="+reasonTimeout {
		t.Errorf("%s = %q, want a fallback for the timeout", HeaderPD, got)
	}
	if n := attempts.Load(); n != 1 {
		t.Errorf("%d prefill attempts, want 1: a timeout spent the budget", n)
	}
}

// TestCircuitBreakerReadmitsAfterTheCoolDown: an engine that answers
// /health but fails requests is ejected; the health checks keep it out
// until the cool-down is over, then re-admit it, and once fixed it serves
// again.
func TestCircuitBreakerReadmitsAfterTheCoolDown(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	flaky := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if broken.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		prefillOK(w, r, body)
	})
	good := newFake(t, prefillOK)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, PrefillRetries: -1, HealthInterval: 20 * time.Millisecond},
		[]*fakeEngine{flaky, good}, []*fakeEngine{newFake(t, decodeJSON)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.runHealth(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	b := p.prefill.list()[0]
	for i := 0; i < 20 && b.healthy.Load(); i++ {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	}
	if b.healthy.Load() {
		t.Fatal("the failing engine was never ejected")
	}
	b.mu.Lock()
	until := b.ejectedUntil
	b.mu.Unlock()
	broken.Store(false) // fixed, but still cooling down
	time.Sleep(time.Until(until) - 200*time.Millisecond)
	// Both read before the clock: a loaded machine may wake the test past
	// the cool-down's end, when re-admission is right; the checks hold for
	// what was read while it still lasted.
	healthy, st := b.healthy.Load(), p.prefill.states()[0]
	if left := time.Until(until); left > 0 {
		if healthy {
			t.Fatalf("re-admitted %v before the cool-down's end", left)
		}
		if !strings.Contains(st.LastError, "circuit breaker") {
			t.Errorf("/health says %q while ejected, want the circuit breaker named", st.LastError)
		}
	} else {
		t.Logf("woke %v past the cool-down's end: its checks while ejected skipped", -left)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !b.healthy.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !b.healthy.Load() {
		t.Fatal("not re-admitted after the cool-down")
	}
	if late := time.Since(until); late < 0 {
		t.Errorf("re-admitted %v early", -late)
	}
	before := counts([]*fakeEngine{flaky})[0]
	for i := range 6 {
		if resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil); resp.Header.Get(HeaderPD) != "remote" {
			t.Fatalf("request %d after re-admission: %s = %q, want remote", i, HeaderPD, resp.Header.Get(HeaderPD))
		}
	}
	if got := counts([]*fakeEngine{flaky})[0] - before; got < 2 {
		t.Errorf("the re-admitted engine served %d of 6 requests, want its share", got)
	}
	b.mu.Lock()
	ejections := b.ejections
	b.mu.Unlock()
	if ejections != 0 {
		t.Errorf("ejections in a row = %d after serving again, want 0 (the next ejection starts from the base cool-down)", ejections)
	}
}
