package planner

import "fmt"

// uncertainFit says why a move from the current split (valued at
// threshold curTh) to target (at targetTh) rests on the decode fit's
// residual rather than on its curve, "" when it does not: target must
// lead the current split at both ends of what the residual may be.
//
// The model prices the decode step's residual (Fit.StepSigma) as the
// steps' own spread: a decode keeps its batch low enough that its streams
// meet the TPOT objective even on a step that much slower (batchAtSLO,
// tpotMiss). A scrape's inter-token latency is a window's mean over a
// batch that changed in it, measured on a wall clock that other work on
// the host stretches, and early in a run, from few scrapes, the residual
// came out 5–18 ms against a 25-ms objective where the steps' own spread
// was under 1 ms: every decode then seemed worth a fraction of its batch,
// the split with the most decodes (the colocated one) ranked first, and
// the split went to it for 15 s and missed the objectives, or wandered.
// The fit cannot tell the steps' spread from the scrapes' noise, so the
// move must hold at both ends: the residual all the steps' (as priced,
// target.Goodput against cur.Goodput) and none of it (StepSigma 0, the
// curve as fitted). A move the curve itself calls for leads at both; a
// clean fit's residual changes little between them, and its moves are
// not slowed. Decide asks only where the move passes the hysteresis.
func (pl *Planner) uncertainFit(f Fit, cur Split, curTh int, target Split, targetTh int) string {
	if f.StepSigma <= 0 {
		return ""
	}
	g := f
	g.StepSigma = 0
	gc := pl.model(g, curTh).split(cur.P, cur.D).Goodput
	gt := pl.model(g, targetTh).split(target.P, target.D).Goodput
	if gt > gc {
		return ""
	}
	return fmt.Sprintf("uncertain decode fit: %dP:%dD is predicted %.2f req/s against %.2f now with the decode step's residual (%.1f ms) as its spread, but %.2f against %.2f with none of it (the scrapes' noise): the lead is the residual's, not the step curve's",
		target.P, target.D, target.Goodput, cur.Goodput, f.StepSigma, gt, gc)
}
