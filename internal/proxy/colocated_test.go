package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestStartsWithNoPrefillEngine: a proxy given decodes only, under a
// decider that keeps prompts local, is the colocated split from the start:
// ready (fallback off, no planner), every prompt prefilled on its decode
// (reason colocated) and no leg sent to a prefill engine; under the always
// decider, which sends every prompt to one, it is refused.
func TestStartsWithNoPrefillEngine(t *testing.T) {
	for _, decider := range []string{"conditional", "priced"} {
		t.Run(decider, func(t *testing.T) {
			engines := []*fakeEngine{newFake(t, bothRoles), newFake(t, bothRoles)}
			p, url := startProxy(t, Config{PDDecider: decider, Fallback: false}, nil, engines)
			if !p.Ready() {
				t.Fatal("not ready with two healthy decodes and no prefill engine listed")
			}
			long := `{"model":"m","prompt":"` + strings.Repeat("long prompt ", 400) + `","max_tokens":4}`
			for _, body := range []string{`{"model":"m","prompt":"hello","max_tokens":4}`, long} {
				r, answer := post(t, url, "/v1/completions", body, nil)
				if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "local; reason="+reasonColocated {
					t.Fatalf("%d, x-tandem-pd %q: %s; want served on a decode, reason colocated", r.StatusCode, r.Header.Get(HeaderPD), answer)
				}
			}
			noRemoteLegs(t, engines)
			if got := metricValue(t, p, "tandem:proxy_pd_decisions_total", map[string]string{"decision": "local", "reason": reasonColocated}); got != 2 {
				t.Fatalf("colocated decisions counted %v, want 2", got)
			}
		})
	}
	_, err := New(Config{PDDecider: "always", Decode: []string{"127.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "no prefill backends") {
		t.Fatalf("New with the always decider and no prefill engine: %v, want it refused", err)
	}
}

// TestPlannerStartsColocated: the planner's proxy started with no prefill
// engine (tandem up --prefill 0 with the SLO flags) plans and reports
// 0P:3D, serves every request on a decode, and moves an engine into the
// prefill pool when long prompts and a tight TPOT ask for one, which then
// prefills remotely.
func TestPlannerStartsColocated(t *testing.T) {
	engines := []*fakeEngine{newFake(t, bothRoles), newFake(t, bothRoles), newFake(t, bothRoles)}
	p, url := startActingPlanner(t, nil, engines)
	startMover(t, p)

	_, plan, err := getPlan(t, url)
	if err != nil || !plan.Acting || len(plan.Prefill) != 0 || len(plan.Decode) != 3 {
		t.Fatalf("GET %s at start: %+v (%v), want the planner acting on 0 prefill + 3 decode", PlanPath, plan, err)
	}
	if got := metricValue(t, p, "tandem:planner_desired_replicas", map[string]string{"role": "prefill"}); got != 0 {
		t.Fatalf("desired prefill replicas at start = %v, want 0", got)
	}
	if got := metricValue(t, p, "tandem:planner_desired_replicas", map[string]string{"role": "decode"}); got != 3 {
		t.Fatalf("desired decode replicas at start = %v, want 3", got)
	}
	r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":4}`, nil)
	if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "local; reason="+reasonColocated {
		t.Fatalf("a request at 0P:3D: %d, x-tandem-pd %q: %s", r.StatusCode, r.Header.Get(HeaderPD), body)
	}
	noRemoteLegs(t, engines)

	now := p.now()
	observeWindow(p, now, 3000, 8)
	d := p.planOnce(now)
	if d.Prefill < 1 || d.Prefill+d.Decode != 3 {
		t.Fatalf("long prompts, short answers: decision %dP:%dD, best %+v (held %q), want a prefill engine", d.Prefill, d.Decode, d.Best, d.Held)
	}
	testutil.WaitFor(t, "engines moved into the prefill pool", 5*time.Second, func() bool {
		return len(p.prefill.list()) == d.Prefill && len(p.decode.list()) == d.Decode && p.plan.moving.Load() == nil
	})
	r, body = post(t, url, "/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("long prompt ", 400)+`","max_tokens":4}`, nil)
	if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "remote" {
		t.Fatalf("a long prompt at %dP:%dD: %d, x-tandem-pd %q: %s", d.Prefill, d.Decode, r.StatusCode, r.Header.Get(HeaderPD), body)
	}
}

// noRemoteLegs fails if any engine got a P/D leg (KV releases aside).
func noRemoteLegs(t *testing.T, engines []*fakeEngine) {
	t.Helper()
	for _, e := range engines {
		for _, got := range legs(e) {
			if got.Path != "/metrics" && strings.Contains(got.Body, "do_remote") {
				t.Fatalf("engine %s got a P/D leg with no prefill pool: %s", e.URL(), got.Body)
			}
		}
	}
}

// TestColocatedConversationTurn: in conversation mode with no prefill
// engine, a turn that continues a history (which only a prefill leg could
// pull) is prefilled on the history's decode (reason colocated), not sent
// toward a prefill engine that does not exist, and the history's hold is
// released.
func TestColocatedConversationTurn(t *testing.T) {
	expires := float64(time.Now().Add(time.Hour).Unix())
	decs := []*fakeEngine{newFake(t, bidiDecode("0", expires)), newFake(t, bidiDecode("1", expires))}
	p, url := startProxy(t, Config{PDDecider: "conditional", Policy: "round-robin", Conversations: true}, nil, decs)
	var on []int
	for n := range 2 {
		r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"Once upon","max_tokens":4,"conversation_id":"c"}`, nil)
		if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != "local; reason="+reasonColocated {
			t.Fatalf("turn %d: %d, x-tandem-pd %q: %s; want it prefilled on its decode (reason colocated)", n+1, r.StatusCode, r.Header.Get(HeaderPD), body)
		}
		on = append(on, whichGot(decs, r.Header.Get("X-Request-Id")))
	}
	if on[0] != on[1] {
		t.Errorf("turns on decodes %v, want turn 2 on turn 1's", on)
	}
	noRemoteLegs(t, decs)
	waitFor(t, func() bool {
		return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": releaseHistoryUnused, "result": "released"}) == 1
	})
	if got := metricValue(t, p, "tandem:proxy_fallbacks_total", map[string]string{"reason": reasonNoPrefill}); got != 0 {
		t.Errorf("%v fallbacks for want of a prefill engine, want 0", got)
	}
}
