package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func plannerConfig() *planner.Config {
	return &planner.Config{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond, MinRequests: 5}
}

// getPlan reads the proxy's plan answer at url: its HTTP status, and the
// body decoded, with the decode error.
func getPlan(t *testing.T, url string) (int, planBody, error) {
	t.Helper()
	resp, err := http.Get(url + PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body planBody
	err = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body, err
}

// TestRoleSwitchJoinsAtOnceAndFinishesHeldKV moves a prefill engine that
// holds a request's KV to the decode pool: it takes no new prefill and
// joins the decode pool at once, takes new decode legs while the KV it
// holds is still waiting for its decode, and is counted as switched (and
// movable again) only once that decode has read it; the request is
// answered, nothing is released early, and no KV is left held.
func TestRoleSwitchJoinsAtOnceAndFinishesHeldKV(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	blockingDecode := func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		decodeJSON(w, r, body)
	}
	both := func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"do_remote_decode":true`) {
			prefillOK(w, r, body)
			return
		}
		decodeJSON(w, r, body)
	}
	pre := []*fakeEngine{newFake(t, both), newFake(t, both)}
	dec := []*fakeEngine{newFake(t, blockingDecode)}
	t.Cleanup(unblock) // before the engines close: a failed check leaves no handler blocked
	p, url := startProxy(t, Config{PDDecider: "always", Policy: "round-robin", Planner: plannerConfig(), PlannerAct: true, Fallback: true}, pre, dec)

	send := func(answered chan<- int) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":4}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}
	answered := make(chan int, 16)
	go send(answered)
	// The request's KV is held on whichever prefill answered it.
	var holder *backend
	testutil.WaitFor(t, "a prefill holding the request's KV", 5*time.Second, func() bool {
		for _, b := range p.prefill.list() {
			if b.holds.Load() > 0 {
				holder = b
				return true
			}
		}
		return false
	})
	fake := pre[slices.IndexFunc(pre, func(f *fakeEngine) bool { return f.URL() == holder.base })]
	legs := func(prefill bool) (n int) {
		for _, r := range fake.requests() {
			if r.Path == "/v1/completions" && strings.Contains(r.Body, `"do_remote_decode":true`) == prefill {
				n++
			}
		}
		return n
	}
	done, err := p.switchRole(context.Background(), holder, p.prefill, p.decode)
	if err != nil {
		t.Fatal(err)
	}
	// At once: out of the prefill pool, in the decode pool, while it still
	// holds the KV a decode has not read.
	if slices.Contains(urlsOf(p.prefill), holder.base) || !slices.Contains(urlsOf(p.decode), holder.base) {
		t.Fatalf("after the switch: prefill %v, decode %v; want the engine in the decode pool at once", urlsOf(p.prefill), urlsOf(p.decode))
	}
	if holder.holds.Load() != 1 {
		t.Fatalf("the engine's old role holds %d KV, want the request's 1 still held", holder.holds.Load())
	}
	p.plan.mu.Lock()
	finishing := p.plan.finishing[holder.base]
	p.plan.mu.Unlock()
	if finishing != "prefill→decode" {
		t.Fatalf("finishing[%s] = %q, want prefill→decode while its old work goes on", holder.base, finishing)
	}
	// New requests: their prefill goes to the other engine, and the moved
	// engine takes decode legs while its held KV still waits.
	for i := 0; legs(false) == 0 && i < 8; i++ {
		go send(answered)
		testutil.WaitFor(t, "the request's prefill leg", 5*time.Second, func() bool {
			n := 0
			for _, f := range pre {
				for _, r := range f.requests() {
					if strings.Contains(r.Body, `"do_remote_decode":true`) {
						n++
					}
				}
			}
			return n == i+2
		})
		testutil.WaitFor(t, "the request's decode leg started", 5*time.Second, func() bool {
			return len(fake.requests())+len(dec[0].requests()) >= i+2
		})
	}
	if legs(false) == 0 {
		t.Fatal("the moved engine took no decode leg while its old work went on")
	}
	if n := legs(true); n != 1 {
		t.Fatalf("the moved engine got %d prefill legs, want only the one before the switch", n)
	}
	for _, r := range fake.requests() {
		if r.Path == kvReleasePath {
			t.Fatal("the KV the moved engine held was released before its decode read it")
		}
	}
	select {
	case <-done:
		t.Fatal("the switch counted as done while the engine still held KV")
	default:
	}
	if got := metricValue(t, p, "tandem:planner_role_switches_total", map[string]string{"to": "decode"}); got != 0 {
		t.Fatalf("role switches to decode = %v before the old work ended, want 0", got)
	}
	if m := p.plan.moving.Load(); m != nil {
		t.Fatalf("moving = %q after the engine joined its pool", *m)
	}

	unblock()
	<-done
	for range len(dec[0].requests()) + legs(false) {
		if code := <-answered; code != http.StatusOK {
			t.Fatalf("a request during the switch got %d", code)
		}
	}
	if got := metricValue(t, p, "tandem:planner_role_switches_total", map[string]string{"to": "decode"}); got != 1 {
		t.Fatalf("role switches to decode = %v, want 1", got)
	}
	p.plan.mu.Lock()
	left := len(p.plan.finishing)
	p.plan.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d engines still finishing old work", left)
	}
	for _, b := range append(append([]*backend{holder}, p.prefill.list()...), p.decode.list()...) {
		if b.holds.Load() != 0 || b.inFlight.Load() != 0 {
			t.Errorf("%s (%s): %d held KV, %d in flight after every request ended", b.base, b.role, b.holds.Load(), b.inFlight.Load())
		}
	}
}

// TestPlanEndpointAndMetricsPublishTheDecision feeds the planner a window
// of long prompts and checks what one decision publishes: the desired
// replicas, the threshold the conditional decider then uses, and GET
// /tandem/plan; and that the route changes nothing.
func TestPlanEndpointAndMetricsPublishTheDecision(t *testing.T) {
	pre := []*fakeEngine{newFake(t, prefillOK)}
	dec := []*fakeEngine{newFake(t, decodeJSON), newFake(t, decodeJSON), newFake(t, decodeJSON)}
	cfg := plannerConfig()
	cfg.Hysteresis = 0.01
	cfg.MaxThreshold = 1024 // prompts over 1024 tokens are prefilled remotely
	// A TPOT objective a local 3000-token prefill would break for the
	// streams it stalls: the decodes cannot take the long prompts (the
	// colocated split) and the prefill pool grows.
	cfg.TPOT = 30 * time.Millisecond
	p, url := startProxy(t, Config{PDDecider: "conditional", Planner: cfg}, pre, dec)

	now := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	p.plan.mu.Lock()
	for i := range 40 {
		at := now.Add(time.Duration(i-40) * 250 * time.Millisecond)
		p.plan.pl.ObserveRequest(planner.Request{At: at, PromptTokens: 3000, UncachedTokens: 3000, OutputTokens: 8})
	}
	for i, f := range append(append([]*fakeEngine{}, pre...), dec...) {
		k := float64(2 + 2*i)
		p.plan.pl.ObserveEngine(planner.EngineSample{At: now, URL: f.URL(), Decode: i > 0, PrefillSecondsPerToken: 0.0002, Running: k, ITLSeconds: (10 + 2*k) / 1000})
	}
	p.plan.mu.Unlock()
	d := p.planOnce(now)
	if !d.Changed || d.Prefill != 2 {
		t.Fatalf("decision %+v, want the split moved one engine toward more prefill for long prompts and short outputs", d)
	}
	if got := metricValue(t, p, "tandem:planner_desired_replicas", map[string]string{"role": "prefill"}); got != 2 {
		t.Fatalf("desired prefill replicas = %v, want 2", got)
	}
	if got := int64(d.Threshold); p.decider.(*plannedConditional).threshold.Load() != got {
		t.Fatalf("the decider's threshold is %d, want the planner's %d", p.decider.(*plannedConditional).threshold.Load(), got)
	}
	// Publish only: the pools are as they were.
	if len(p.prefill.list()) != 1 || len(p.decode.list()) != 3 {
		t.Fatalf("without PlannerAct the pools changed: %v %v", urlsOf(p.prefill), urlsOf(p.decode))
	}

	status, body, err := getPlan(t, url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", PlanPath, status, err)
	}
	if body.Decision == nil || body.Decision.Prefill != 2 || body.Acting || body.Objectives.TTFT != "2s" {
		t.Fatalf("GET %s: %+v", PlanPath, body)
	}
	r, _ := post(t, url, PlanPath, `{"prefill":3}`, nil)
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %d, want 405: nothing a client sends changes the plan", PlanPath, r.StatusCode)
	}
}

func TestPlanEndpointWithThePlannerOffSaysHowToTurnItOn(t *testing.T) {
	_, url := startProxy(t, Config{}, []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)})
	resp, err := http.Get(url + PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "--slo-ttft") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

func TestPlannerActingRefusesBackendsItDoesNotOwn(t *testing.T) {
	_, err := New(Config{Prefill: []string{"http://a:1"}, Decode: []string{"http://b:1"}, DynamicBackends: true, Planner: plannerConfig(), PlannerAct: true})
	if err == nil || !strings.Contains(err.Error(), "publish only") {
		t.Fatalf("err %v", err)
	}
}

// While the planner acts it owns the pools: the admin route lists them but
// refuses to change them (an edit would race the mover's drain).
func TestPlannerActingOwnsTheAdminRoute(t *testing.T) {
	pre, dec := []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)}
	_, url := startProxy(t, Config{Planner: plannerConfig(), PlannerAct: true, Fallback: true, APIKey: "k"}, pre, dec)
	do := func(method, body string) (int, string) {
		req, _ := http.NewRequest(method, url+AdminBackendsPath, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(http.MethodPost, `{"role":"decode","url":"http://127.0.0.1:1"}`); code != http.StatusConflict || !strings.Contains(body, "--planner-act") {
		t.Errorf("adding a decode while the planner acts: %d %s; want 409 naming --planner-act", code, body)
	}
	if code, body := do(http.MethodGet, ""); code != http.StatusOK || strings.Contains(body, "127.0.0.1:1") {
		t.Errorf("listing: %d %s", code, body)
	}
}

// TestPlannerPricesPrefillsFromTheLegs: the prefills the proxy measures
// per leg (observePrefillLeg) reach the planner, which fits its prefill
// curve to them rather than pricing every token at the scraped mean.
func TestPlannerPricesPrefillsFromTheLegs(t *testing.T) {
	p, _ := startProxy(t, Config{PDDecider: "conditional", Planner: plannerConfig()},
		[]*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)})
	pre := p.prefill.list()[0].base
	now := p.now()
	for i := range 12 {
		n := 64 << (i % 4) // 64 to 512 tokens
		sec := 0.004 + 1e-4*float64(n) + 4e-7*float64(n*n)
		p.observePrefillLeg(pre, n, time.Duration(sec*float64(time.Second)), time.Millisecond, false)
	}
	p.plan.mu.Lock()
	for i := range 10 {
		p.plan.pl.ObserveRequest(planner.Request{At: now.Add(-time.Duration(i) * 100 * time.Millisecond), PromptTokens: 300, UncachedTokens: 300, OutputTokens: 16})
	}
	p.plan.mu.Unlock()
	d := p.planOnce(p.now())
	if c := d.Fit.Prefill; c.Source != "measured" || c.Samples != 12 || c.C <= 0 {
		t.Fatalf("prefill curve %+v (held %q), want one fitted to the 12 legs, growing with the square of the length", c, d.Held)
	}
}
