package proxy

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// bothRoles answers like an engine started with --role both: a prefill
// leg's KV handle, or a decode's answer; its /metrics says its role.
func bothRoles(w http.ResponseWriter, r *http.Request, body []byte) { engineOfRole("both")(w, r, body) }

// engineOfRole answers like bothRoles, its /metrics saying role.
func engineOfRole(role string) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch {
		case r.URL.Path == "/metrics":
			io.WriteString(w, "vllm:num_requests_running 0\n"+`tandem:engine_info{max_num_batched_tokens="512",max_num_seqs="64",role="`+role+`"} 1`+"\n")
		case strings.Contains(string(body), `"do_remote_decode"`):
			prefillOK(w, r, body)
		default:
			decodeJSON(w, r, body)
		}
	}
}

// scrapeAll scrapes every engine once: the planner learns their roles.
func scrapeAll(p *Proxy) {
	for _, pl := range []*pool{p.prefill, p.decode} {
		for _, b := range pl.list() {
			p.scrape(context.Background(), b)
		}
	}
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

// startActingPlanner starts a proxy on the engines whose planner acts,
// under a tight TPOT (40 ms) and with no dwell, and scrapes the engines
// once so that it knows their roles. Its plan ticker never fires: the test
// decides at its own times (planOnce).
func startActingPlanner(t *testing.T, prefill, decode []*fakeEngine) (*Proxy, string) {
	t.Helper()
	cfg := plannerConfig()
	cfg.TPOT, cfg.MinDwell, cfg.Window, cfg.Hysteresis = 40*time.Millisecond, time.Nanosecond, 10*time.Second, 0.01
	p, url := startProxy(t, Config{PDDecider: "conditional", Planner: cfg, PlannerAct: true, PlanInterval: time.Hour}, prefill, decode)
	scrapeAll(p)
	return p, url
}

// startMover runs p's engine mover, which carries out the planner's
// decisions, until the test ends.
func startMover(t *testing.T, p *Proxy) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.moveEngines(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestPlannerColocatedSplit: short prompts and long answers make the
// planner choose no prefill engine at all; the mover empties the prefill
// pool, the proxy stays ready and serves every request on a decode (reason
// colocated); long prompts and short answers under a tight TPOT then bring
// an engine back to the prefill pool, and requests are prefilled remotely
// again.
func TestPlannerColocatedSplit(t *testing.T) {
	engines := []*fakeEngine{newFake(t, bothRoles), newFake(t, bothRoles), newFake(t, bothRoles)}
	p, url := startActingPlanner(t, engines[:1], engines[1:])
	startMover(t, p)

	// On the proxy's clock: the mover says when the engines switched
	// (planApplied), and the planner counts the requests since then.
	now := p.now()
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
	noRemoteLegs(t, engines)

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

// TestDecodeStepLeavesOutTheEnginesOwnPrefills: an engine that spent 40%
// of a second computing prompts shows inter-token latencies stretched by
// 1/(1−0.4); the decode step the planner fits is the rest.
func TestDecodeStepLeavesOutTheEnginesOwnPrefills(t *testing.T) {
	at := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	prev := engineSample{at: at, itlSum: 1, itlCount: 100, running: 4, computed: 1000}
	s := engineSample{at: at.Add(time.Second), itlSum: 1 + 40*0.025, itlCount: 140, running: 6, computed: 3000}
	itl, running := decodeStep(prev, s, 0.0002) // 2000 tokens: 0.4 s
	if math.Abs(itl-0.015) > 1e-12 || running != 5 {
		t.Fatalf("step %v s at batch %v, want 0.015 s (25 ms stretched by 1/0.6) at 5", itl, running)
	}
	if itl, _ := decodeStep(prev, engineSample{at: at.Add(time.Second), itlSum: 1, itlCount: 100}, 0.0002); itl != 0 {
		t.Fatalf("no token decoded: step %v, want 0", itl)
	}
}

// TestPlannerMovesOnlyBothRoleEngines: of two prefill engines, the one
// started with --role prefill stays where it is though it is the first
// and as idle as the other; the planner counts it pinned and says why.
func TestPlannerMovesOnlyBothRoleEngines(t *testing.T) {
	pre := []*fakeEngine{newFake(t, engineOfRole("prefill")), newFake(t, bothRoles)}
	dec := []*fakeEngine{newFake(t, bothRoles)}
	p, url := startActingPlanner(t, pre, dec)
	startMover(t, p)

	now := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	observeWindow(p, now, 64, 256) // short prompts: the fewer prefill engines the better
	if d := p.planOnce(now); d.Prefill != 1 || d.Best.P != 1 {
		t.Fatalf("decision %dP:%dD, best %+v (held %q): want 1P, the pinned prefill engine", d.Prefill, d.Decode, d.Best, d.Held)
	}
	testutil.WaitFor(t, "one prefill engine moved", 5*time.Second, func() bool {
		return len(p.prefill.list()) == 1 && p.plan.moving.Load() == nil
	})
	if got := urlsOf(p.prefill); got[0] != pre[0].URL() {
		t.Fatalf("prefill pool %v: the --role prefill engine %s was moved", got, pre[0].URL())
	}
	_, body, err := getPlan(t, url)
	if why := body.Pinned[pre[0].URL()]; err != nil || !strings.Contains(why, "--role prefill") || len(body.Pinned) != 1 {
		t.Fatalf("GET %s pinned %v (%v), want the prefill-only engine named with its role", PlanPath, body.Pinned, err)
	}
}
