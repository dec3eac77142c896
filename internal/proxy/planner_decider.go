package proxy

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
)

// How the planner and the disaggregation decider work together. The
// planner sizes the split from a model that values each split at the
// conditional threshold that predicts it the most goodput. Under the
// conditional decider that threshold is the decider's: it decides every
// request by it (plannedConditional). Under the priced decider each
// request is decided by its own price from the engines' measured costs,
// and the planner's best threshold per split stands for what such a
// per-request decider sends remote (both keep the prompts a decode can
// prefill within the objectives local); the threshold is then the
// decider's fallback only, in place of the static --pd-threshold
// (plannedPriced): for the requests it cannot price yet (no prefill cost
// measured, stale metrics: its unpriced_* reasons), and for those neither
// path serves within the objectives (planned_*: placed where the split
// expects them, priced.Decider.Planned). The proxy counts what the
// decider did with the window's requests (decisionWindow) and /tandem/plan
// reports it beside the model's remote share at the threshold.

// steeredDecider is a decider whose threshold the planner sets at each
// decision.
type steeredDecider interface {
	router.Decider
	setThreshold(tokens int)
}

// reasonColocated is the decision's reason when the planner emptied the
// prefill pool: every engine prefills its own prompts.
const reasonColocated = "colocated"

// plannedConditional is the conditional decider with the threshold the
// planner chose last.
type plannedConditional struct {
	base      conditional.Decider
	threshold atomic.Int64
	// noPrefill says the prefill pool is empty: the planner chose the
	// colocated split.
	noPrefill func() bool
}

// Decide implements router.Decider.
func (d *plannedConditional) Decide(in router.DecideInput) router.Decision {
	if in.PrefillHealthy == 0 && d.noPrefill() {
		return router.Decision{Reason: reasonColocated}
	}
	c := d.base
	c.Threshold = int(d.threshold.Load())
	return c.Decide(in)
}

func (d *plannedConditional) setThreshold(tokens int) { d.threshold.Store(int64(tokens)) }

// plannedPriced is the priced decider with the planner's view where its
// own is missing: the planner's objectives where the decider's are not
// set, and the planner's threshold for the requests it cannot price or
// serve within the objectives either way.
type plannedPriced struct {
	base      priced.Decider
	threshold atomic.Int64
	noPrefill func() bool
}

// Decide implements router.Decider.
func (d *plannedPriced) Decide(in router.DecideInput) router.Decision {
	if in.PrefillHealthy == 0 && d.noPrefill() {
		return router.Decision{Reason: reasonColocated}
	}
	c := d.base
	c.Static.Threshold = int(d.threshold.Load())
	return c.Decide(in)
}

func (d *plannedPriced) setThreshold(tokens int) { d.threshold.Store(int64(tokens)) }

// steerDecider makes the proxy's decider follow the planner configured by
// cfg (defaults applied): the conditional decider takes its threshold, the
// priced decider its threshold as the fallback and its objectives where
// --pd-ttft-slo and --pd-tpot-slo are not set (the decider's defaults, 2 s
// and 100 ms, are not the objectives the planner sizes the split for).
// Another decider (always) is left as it is.
func (p *Proxy) steerDecider(cfg planner.Config) {
	r := p.cfg.Router
	static := conditional.Decider{MustRemote: r.MustRemote, DecodeKVPressure: r.DecodeKVPressure}
	noPrefill := func() bool { return len(p.prefill.list()) == 0 }
	var d steeredDecider
	switch p.cfg.PDDecider {
	case conditional.Name:
		d = &plannedConditional{base: static, noPrefill: noPrefill}
	case priced.Name:
		d = &plannedPriced{base: priced.Decider{TTFTObjective: cmpOrDuration(r.TTFTObjective, cfg.TTFT),
			TPOTObjective: cmpOrDuration(r.TPOTObjective, cfg.TPOT), Static: static, Planned: true}, noPrefill: noPrefill}
	default:
		return
	}
	d.setThreshold(cfg.Threshold)
	p.decider = d
}

func cmpOrDuration(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// thresholdRole says what the planner's threshold is to the decider named:
// "decides" (every request is decided by it), "fallback" (only the
// requests the decider cannot price) or "unused".
func thresholdRole(decider string) string {
	switch decider {
	case conditional.Name:
		return "decides"
	case priced.Name:
		return "fallback"
	}
	return "unused"
}

// decided is one request's decision, as the planner's window keeps it.
type decided struct {
	at time.Time
	// remote says it was prefilled remotely, byThreshold that the
	// planner's threshold decided it under the priced decider.
	remote, byThreshold bool
}

// decisionWindow is the decider's decisions over the planner's window.
type decisionWindow struct {
	window time.Duration
	list   []decided
}

// add records a decision at at and forgets those older than the window.
func (w *decisionWindow) add(at time.Time, d router.Decision) {
	by := strings.HasPrefix(d.Reason, priced.Unpriced) || strings.HasPrefix(d.Reason, priced.Planned)
	w.list = append(w.list, decided{at: at, remote: d.Remote, byThreshold: by})
	w.trim(at)
}

// trim forgets the decisions older than the window before now.
func (w *decisionWindow) trim(now time.Time) {
	from, i := now.Add(-w.window), 0
	for i < len(w.list) && w.list[i].at.Before(from) {
		i++
	}
	if i > 0 {
		w.list = append(w.list[:0], w.list[i:]...)
	}
}

// deciderReport is what the decider did with the window's requests, in
// PlanPath's answer.
type deciderReport struct {
	// Name is the decider's (--pd-decider).
	Name string `json:"name"`
	// Threshold is what the planner's threshold is to it: "decides",
	// "fallback" (the priced decider: only for the requests it cannot
	// price yet) or "unused".
	Threshold string `json:"threshold"`
	// Requests are the window's decided requests, Remote those prefilled
	// remotely, and ByThreshold those the priced decider left to the
	// threshold: for want of a price (unpriced_*) or with neither path
	// within the objectives (planned_*).
	Requests    int `json:"requests"`
	Remote      int `json:"remote"`
	ByThreshold int `json:"by_threshold,omitempty"`
}

// report counts the window's decisions as of now for the decider named.
func (w *decisionWindow) report(name string, now time.Time) deciderReport {
	w.trim(now)
	r := deciderReport{Name: name, Threshold: thresholdRole(name), Requests: len(w.list)}
	for _, d := range w.list {
		if d.remote {
			r.Remote++
		}
		if d.byThreshold {
			r.ByThreshold++
		}
	}
	return r
}
