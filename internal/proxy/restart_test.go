package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"
)

// TestRestartedBackendLeavesTheCircuitBreaker: a backend the circuit breaker
// ejected stays out on plain health checks until its cool-down ends, but
// once whoever runs it says its process was replaced (tandem up's
// supervisor), the new process's first passing health check re-admits it at
// once and forgets the old process's failures.
func TestRestartedBackendLeavesTheCircuitBreaker(t *testing.T) {
	restarted := newFake(t, prefillOK)
	other := newFake(t, prefillOK)
	p, _ := startProxy(t, Config{ScrapeInterval: -1}, []*fakeEngine{restarted, other}, []*fakeEngine{newFake(t, decodeJSON)})
	b := p.prefill.list()[0]
	if b.base != restarted.URL() || !b.healthy.Load() {
		t.Fatalf("backend 0 is %s (healthy %v), want %s healthy", b.base, b.healthy.Load(), restarted.URL())
	}
	log := slog.New(slog.DiscardHandler)
	// Five ejections in a row: a cool-down of 16 s, far beyond this test.
	for range 5 * breakerThreshold {
		legFailed(b, "500 Internal Server Error", log)
	}
	ctx := context.Background()
	p.CheckHealth(ctx)
	if b.healthy.Load() {
		t.Fatal("a plain health check re-admitted an ejected backend before its cool-down's end")
	}
	p.BackendsChanged(ctx, other.URL()) // another engine restarted
	if b.healthy.Load() {
		t.Fatal("another backend's restart re-admitted this one")
	}
	// The new process is not serving yet: the notice waits for a passing check.
	restarted.health.Store(http.StatusServiceUnavailable)
	p.BackendsChanged(ctx, restarted.URL()+"/")
	if b.healthy.Load() {
		t.Fatal("re-admitted while /health answers 503")
	}
	restarted.health.Store(http.StatusOK)
	p.CheckHealth(ctx)
	if !b.healthy.Load() {
		t.Fatalf("the restarted engine's passing health check did not re-admit it: %s", p.prefill.states()[0].LastError)
	}
	b.mu.Lock()
	fails, ejections, until := b.fails, b.ejections, b.ejectedUntil
	b.mu.Unlock()
	if fails != 0 || ejections != 0 || !until.IsZero() {
		t.Errorf("breaker after the restart: fails %d, ejections %d, ejected until %v; want all cleared", fails, ejections, until)
	}
	// A failure of the new process starts from the bottom: one ejection
	// takes breakerBase, not the old process's doubled cool-down.
	for range breakerThreshold {
		legFailed(b, "500 Internal Server Error", log)
	}
	b.mu.Lock()
	left := time.Until(b.ejectedUntil)
	b.mu.Unlock()
	if left > breakerBase {
		t.Errorf("first ejection of the new process lasts %v, want at most %v", left, breakerBase)
	}
}
