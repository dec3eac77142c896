package planner

import (
	"fmt"
	"time"
)

// Settling: after a change of the split the planner measures the new
// split before it moves again. A decision moments after a move is fitted
// to a window of requests the old split served and to engine costs
// scraped before the engines switched pools; on a short window its best
// split swings from one decision to the next, and each swing moved the
// split again (the P/D experiment's chat grid: 0P:4D → 1P:3D → 2P:2D →
// 1P:3D → 0P:4D in 3.2 s as a 60-request level began, the best split's
// prediction 16–83 req/s between decisions, the level at 35% met). As
// Kubernetes' HPA keeps a stabilization window and Dynamo's planner
// decides on the metrics of the interval since its last adjustment, a
// move waits until the split it made has been measured:
//
//   - the change has taken effect: with Config.ReportsApplied the caller
//     says when the engines switched pools (Applied), and until then the
//     split holds; without it the change counts from its decision;
//   - most of the requests the decision is fitted to (at least half, and
//     at least as many as a shift of the mix is judged on) arrived since
//     then, routed on the new split: in steady traffic half a window;
//   - every engine with fresh metrics was scraped since then.
//
// Steps in the direction of the last change wait as turns back do (the
// dwells still apply on top). One move is exempt: after a shift of the
// traffic mix (shift.go), a split the model predicts noiseLeads
// hystereses ahead moves at once, as the dwells allow: the model is then
// fitted to the new mix alone and its lead is the mix's, not the old
// split's measurements.

// settling says why the split may not move from cur to target yet at now,
// "" when it may: the last change has not been measured (see above).
func (pl *Planner) settling(now time.Time, f Fit, cur, target Split) string {
	if pl.lastChange.IsZero() {
		return ""
	}
	if f.Shift != "" && target.Goodput >= cur.Goodput*(1+noiseLeads*pl.cfg.Hysteresis) {
		return ""
	}
	moved := fmt.Sprintf("settling after the move to %dP:%dD at %s", pl.prefill, pl.cfg.Engines-pl.prefill, pl.lastChange.UTC().Format("15:04:05.000"))
	from, ok := pl.appliedFrom()
	if !ok {
		return fmt.Sprintf("%s: the engines have not switched pools yet (%v since the decision)", moved, now.Sub(pl.lastChange).Round(100*time.Millisecond))
	}
	n, m := 0, len(pl.win)
	for _, r := range pl.win {
		if !r.At.Before(from) {
			n++
		}
	}
	if need := settleRequests(pl.cfg, m); n < need {
		return fmt.Sprintf("%s: %d of %d requests measured on it (of the %d fitted)", moved, n, need, m)
	}
	// Each engine's last sample within MaxAge: an engine whose metrics went
	// stale is not waited for.
	last := map[string]time.Time{}
	for _, s := range pl.samples {
		if now.Sub(s.At) <= pl.cfg.MaxAge && s.At.After(last[s.URL]) {
			last[s.URL] = s.At
		}
	}
	scraped := 0
	for _, at := range last {
		if !at.Before(from) {
			scraped++
		}
	}
	if scraped < len(last) {
		return fmt.Sprintf("%s: %d of %d engines scraped since it took effect", moved, scraped, len(last))
	}
	return ""
}

// settleRequests is how many of a decision's m fitted requests must have
// arrived since the last change took effect: most of them, and at least as
// many as a shift of the mix is judged on.
func settleRequests(c Config, m int) int { return max(shiftSample(c), (m+1)/2) }

// appliedFrom is when the last change took effect: when the caller said
// the engines switched (Applied) with Config.ReportsApplied, else its
// decision. ok is false while the caller has not said so yet.
func (pl *Planner) appliedFrom() (from time.Time, ok bool) {
	if !pl.cfg.ReportsApplied {
		return pl.lastChange, true
	}
	if pl.applied.Before(pl.lastChange) {
		return time.Time{}, false
	}
	return pl.applied, true
}

// Applied tells the planner that the split of prefill engines runs from
// at: the engines of its last change have switched pools, and the
// requests routed from then are the new split's. Only a caller that
// reports it (Config.ReportsApplied) calls it; a report of another split
// than the planner's (its engines still moving), or of a change already
// reported, is ignored.
func (pl *Planner) Applied(at time.Time, prefill int) {
	if prefill != pl.prefill || pl.lastChange.IsZero() || !pl.applied.Before(pl.lastChange) {
		return
	}
	pl.applied = at
	if at.Before(pl.lastChange) {
		pl.applied = pl.lastChange
	}
}
