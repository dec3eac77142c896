package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// bothRoles answers like an engine started with --role both: a prefill
// leg's KV handle, or a decode's answer.
func bothRoles(w http.ResponseWriter, r *http.Request, body []byte) {
	if strings.Contains(string(body), `"do_remote_decode"`) {
		prefillOK(w, r, body)
		return
	}
	decodeJSON(w, r, body)
}

// observeWindow gives the planner a window of requests of prompt and
// output tokens ending at now, and three scrapes of every engine (the
// decodes at batches of 2, 4 and 8, 10 + 2·k ms a step).
func observeWindow(p *Proxy, now time.Time, prompt, output int) {
	p.plan.mu.Lock()
	defer p.plan.mu.Unlock()
	for i := range 40 {
		at := now.Add(time.Duration(i-40) * 250 * time.Millisecond)
		p.plan.pl.ObserveRequest(planner.Request{At: at, PromptTokens: prompt, UncachedTokens: prompt, OutputTokens: output})
	}
	decodes := map[string]bool{}
	for _, u := range urlsOf(p.decode) {
		decodes[u] = true
	}
	for _, u := range append(urlsOf(p.prefill), urlsOf(p.decode)...) {
		for j, k := range []float64{2, 4, 8} {
			p.plan.pl.ObserveEngine(planner.EngineSample{At: now.Add(time.Duration(j-2) * time.Second), URL: u, Decode: decodes[u],
				PrefillSecondsPerToken: 0.0002, Running: k, ITLSeconds: (10 + 2*k) / 1000})
		}
	}
}

// TestPlannerColocatedSplit: short prompts and long answers make the
// planner choose no prefill engine at all; the mover empties the prefill
// pool, the proxy stays ready and serves every request on a decode (reason
// colocated); long prompts and short answers under a tight TPOT then bring
// an engine back to the prefill pool, and requests are prefilled remotely
// again.
func TestPlannerColocatedSplit(t *testing.T) {
	engines := []*fakeEngine{newFake(t, bothRoles), newFake(t, bothRoles), newFake(t, bothRoles)}
	cfg := plannerConfig()
	cfg.TPOT, cfg.MinDwell, cfg.Window, cfg.Hysteresis = 40*time.Millisecond, time.Nanosecond, 10*time.Second, 0.01
	// The plan ticker never fires: the test decides at its own times.
	p, url := startProxy(t, Config{PDDecider: "conditional", Planner: cfg, PlannerAct: true, PlanInterval: time.Hour}, engines[:1], engines[1:])
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.moveEngines(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	now := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	observeWindow(p, now, 64, 256)
	if d := p.planOnce(now); d.Prefill != 0 || d.Best.P != 0 {
		t.Fatalf("chat-like traffic: decision %dP:%dD, best %+v (held %q), want the colocated split", d.Prefill, d.Decode, d.Best, d.Held)
	}
	testutil.WaitFor(t, "the prefill pool emptied", 5*time.Second, func() bool {
		return len(p.prefill.list()) == 0 && len(p.decode.list()) == 3 && p.plan.moving.Load() == nil
	})
	if got := metricValue(t, p, "tandem:planner_desired_replicas", map[string]string{"role": "prefill"}); got != 0 {
		t.Fatalf("desired prefill replicas = %v, want 0", got)
	}
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var health healthBody
	err = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || health.Status != "ok" || len(health.Prefill) != 0 {
		t.Fatalf("/health with no prefill engine: %d %+v (%v), want 200 ok", resp.StatusCode, health, err)
	}
	for range 3 {
		r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":4}`, nil)
		if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "local; reason="+reasonColocated {
			t.Fatalf("a request with no prefill engine: %d, x-tandem-pd %q: %s", r.StatusCode, r.Header.Get(HeaderPD), body)
		}
	}
	for _, e := range engines {
		for _, got := range e.requests() {
			if strings.Contains(got.Body, "do_remote") {
				t.Fatalf("engine %s got a P/D leg with no prefill pool: %s", e.URL(), got.Body)
			}
		}
	}

	now = now.Add(time.Minute)
	observeWindow(p, now, 3000, 8)
	if d := p.planOnce(now); d.Prefill < 1 {
		t.Fatalf("long prompts, short answers: decision %dP:%dD, best %+v (held %q), want a prefill engine back", d.Prefill, d.Decode, d.Best, d.Held)
	}
	testutil.WaitFor(t, "an engine back in the prefill pool", 5*time.Second, func() bool {
		return len(p.prefill.list()) >= 1 && p.plan.moving.Load() == nil
	})
	r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("long prompt ", 400)+`","max_tokens":4}`, nil)
	if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "remote" {
		t.Fatalf("a long prompt with a prefill engine back: %d, x-tandem-pd %q: %s", r.StatusCode, r.Header.Get(HeaderPD), body)
	}
}
