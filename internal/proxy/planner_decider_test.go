package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
)

// TestPricedDeciderTakesThePlannersView: under the planner, the priced
// decider prices against the planner's objectives where --pd-ttft-slo and
// --pd-tpot-slo are not set (its own where they are), decides the
// requests it cannot price by the threshold the planner chose last (not
// the static --pd-threshold), and /tandem/plan says the threshold is its
// fallback and counts what it decided in the window. Before, the priced
// decider ignored the planner: it priced against 2 s and 100 ms whatever
// the objectives the split was sized for.
func TestPricedDeciderTakesThePlannersView(t *testing.T) {
	cfg := plannerConfig()
	cfg.TTFT, cfg.TPOT = 300*time.Millisecond, 25*time.Millisecond
	p, url := startProxy(t, Config{PDDecider: priced.Name, Planner: cfg}, []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)})
	d, ok := p.decider.(*plannedPriced)
	if !ok {
		t.Fatalf("decider %T, want the priced decider steered by the planner", p.decider)
	}
	if d.base.TTFTObjective != cfg.TTFT || d.base.TPOTObjective != cfg.TPOT {
		t.Fatalf("objectives %v/%v, want the planner's %v/%v", d.base.TTFTObjective, d.base.TPOTObjective, cfg.TTFT, cfg.TPOT)
	}
	if got := d.threshold.Load(); got != 256 {
		t.Fatalf("fallback threshold %d before a decision, want the planner's start (256)", got)
	}

	now := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	observeWindow(p, now, 3000, 8)
	dec := p.planOnce(now)
	if got := d.threshold.Load(); got != int64(dec.Threshold) {
		t.Fatalf("fallback threshold %d, want the decision's %d", got, dec.Threshold)
	}
	// A cold decider (nothing measured) decides by that threshold.
	d.setThreshold(1000)
	in := router.DecideInput{Req: &router.Request{PromptTokens: 600, BlockSize: 16, MaxTokens: 8}, Decode: router.Endpoint{Role: "decode"},
		PrefillHealthy: 1, PrefillFree: 1, Prefill: []router.Endpoint{{Role: "prefill"}}}
	if got := d.Decide(in); got.Remote || got.Reason != priced.Unpriced+conditional.ShortUncached {
		t.Fatalf("600 tokens unpriced under a threshold of 1000: %+v, want local by the threshold", got)
	}
	d.setThreshold(500)
	if got := d.Decide(in); !got.Remote || got.Reason != priced.Unpriced+conditional.LongUncached {
		t.Fatalf("600 tokens unpriced under a threshold of 500: %+v, want remote by the threshold", got)
	}

	// Through the proxy: the engines report no costs, so both requests
	// are decided by the threshold (16 tokens).
	d.setThreshold(16)
	for _, c := range []struct{ prompt, pd string }{
		{"hi", "local; reason=" + priced.Unpriced + conditional.ShortUncached},
		{strings.Repeat("long prompt ", 100), "remote"},
	} {
		r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"`+c.prompt+`","max_tokens":4}`, nil)
		if r.StatusCode != http.StatusOK || r.Header.Get(HeaderPD) != c.pd {
			t.Fatalf("prompt of %d bytes: %d, x-tandem-pd %q, want %q: %s", len(c.prompt), r.StatusCode, r.Header.Get(HeaderPD), c.pd, body)
		}
	}
	_, body, err := getPlan(t, url)
	if err != nil {
		t.Fatal(err)
	}
	want := deciderReport{Name: priced.Name, Threshold: "fallback", Requests: 2, Remote: 1, ByThreshold: 2}
	if body.Decider != want {
		t.Fatalf("GET %s: decider %+v, want %+v", PlanPath, body.Decider, want)
	}
}

// TestPricedDeciderKeepsItsOwnObjectives: --pd-ttft-slo and --pd-tpot-slo
// win over the planner's objectives.
func TestPricedDeciderKeepsItsOwnObjectives(t *testing.T) {
	cfg := Config{PDDecider: priced.Name, Planner: plannerConfig()}
	cfg.Router.TTFTObjective, cfg.Router.TPOTObjective = time.Second, 50*time.Millisecond
	p, _ := startProxy(t, cfg, []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)})
	d := p.decider.(*plannedPriced)
	if d.base.TTFTObjective != time.Second || d.base.TPOTObjective != 50*time.Millisecond {
		t.Fatalf("objectives %v/%v, want --pd-ttft-slo 1s and --pd-tpot-slo 50ms", d.base.TTFTObjective, d.base.TPOTObjective)
	}
}

// TestDecisionWindowForgetsWhatLeftIt: the window's counts are of the
// decisions within the planner's window before now.
func TestDecisionWindowForgetsWhatLeftIt(t *testing.T) {
	w := decisionWindow{window: 10 * time.Second}
	t0 := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	w.add(t0, router.Decision{Remote: true, Reason: priced.Cheaper})
	w.add(t0.Add(5*time.Second), router.Decision{Reason: priced.Unpriced + conditional.ShortUncached})
	w.add(t0.Add(9*time.Second), router.Decision{Remote: true, Reason: priced.Planned + conditional.LongUncached})
	if got, want := w.report(priced.Name, t0.Add(9*time.Second)), (deciderReport{Name: priced.Name, Threshold: "fallback", Requests: 3, Remote: 2, ByThreshold: 2}); got != want {
		t.Fatalf("within the window: %+v, want %+v", got, want)
	}
	if got, want := w.report(conditional.Name, t0.Add(16*time.Second)), (deciderReport{Name: conditional.Name, Threshold: "decides", Requests: 1, Remote: 1, ByThreshold: 1}); got != want {
		t.Fatalf("16 s on: %+v, want %+v", got, want)
	}
}
