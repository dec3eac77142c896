package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func plannerConfig() *planner.Config {
	return &planner.Config{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond, MinRequests: 5}
}

// TestRoleSwitchDrainsHeldKVFirst moves a prefill engine that holds a
// request's KV to the decode pool: it takes no new prefill at once, joins
// the decode pool only once the decode leg that reads its KV has ended, and
// the request is answered.
func TestRoleSwitchDrainsHeldKVFirst(t *testing.T) {
	release := make(chan struct{})
	blockingDecode := func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-release
		decodeJSON(w, r, body)
	}
	both := func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"do_remote_decode"`) {
			prefillOK(w, r, body)
			return
		}
		decodeJSON(w, r, body)
	}
	pre := []*fakeEngine{newFake(t, both), newFake(t, both)}
	dec := []*fakeEngine{newFake(t, blockingDecode)}
	p, url := startProxy(t, Config{PDDecider: "always", Planner: plannerConfig(), PlannerAct: true, Fallback: true}, pre, dec)

	answered := make(chan int, 1)
	go func() {
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
	}()
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
	switched := make(chan error, 1)
	go func() { switched <- p.switchRole(context.Background(), holder, p.prefill, p.decode) }()
	testutil.WaitFor(t, "the engine out of the prefill pool", 5*time.Second, func() bool {
		return !slices.Contains(urlsOf(p.prefill), holder.base)
	})
	// It holds KV a decode has not read: it must not have joined the
	// decode pool yet.
	select {
	case err := <-switched:
		t.Fatalf("the switch finished (err %v) while the engine held KV", err)
	default:
	}
	if slices.Contains(urlsOf(p.decode), holder.base) {
		t.Fatal("the engine joined the decode pool while it held KV")
	}
	if m := p.plan.moving.Load(); m == nil || !strings.Contains(*m, "prefill→decode") {
		t.Fatalf("moving = %v, want the switch named", m)
	}
	close(release)
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the request in flight during the switch got %d", code)
	}
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(urlsOf(p.decode), holder.base) || slices.Contains(urlsOf(p.prefill), holder.base) {
		t.Fatalf("after the switch: prefill %v, decode %v", urlsOf(p.prefill), urlsOf(p.decode))
	}
	if got := metricValue(t, p, "tandem:planner_role_switches_total", map[string]string{"to": "decode"}); got != 1 {
		t.Fatalf("role switches to decode = %v, want 1", got)
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

	resp, err := http.Get(url + PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	var body planBody
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", PlanPath, resp.StatusCode, err)
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
