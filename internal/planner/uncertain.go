package planner

import (
	"fmt"
	"math"
)

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
//
// The curve itself is as uncertain: fitted to noisy scrapes over batches
// 3–9, the simulated engine's step (about 12 + 0.5·k ms there) came out
// 1.6 + 3.4·k^0.8, a step cheap at the colocated split's small batches and
// dear at the pool's, and colocated led with none of the residual too. So
// the move must also lead with the slope StepB uncertainSlopeErrors
// standard errors (StepBSE) either side, the curve turned about the points' centre (where
// the points pin it), both without the residual. A clean fit's slope is
// known to a few percent and its bounds agree.
func (pl *Planner) uncertainFit(f Fit, cur Split, curTh int, target Split, targetTh int) string {
	if f.StepSigma <= 0 {
		return ""
	}
	for _, turn := range []float64{0, -uncertainSlopeErrors, uncertainSlopeErrors} {
		g := f
		g.StepSigma = 0
		if turn != 0 {
			if f.StepBSE <= 0 {
				continue
			}
			g.StepB = max(f.StepB+turn*f.StepBSE, 0.01*f.StepB)
			g.StepA = max(f.StepA-(g.StepB-f.StepB)*f.stepPivot, 0)
		}
		gc := pl.model(g, curTh).split(cur.P, cur.D).Goodput
		gt := pl.model(g, targetTh).split(target.P, target.D).Goodput
		if gt > gc {
			continue
		}
		return fmt.Sprintf("uncertain decode fit: %dP:%dD is predicted %.2f req/s against %.2f now with the decode step's residual (%.1f ms) as its spread, but %.2f against %.2f with none of it and the step %.2f + %.2f·k^%.2f ms (the fit's %.2f + %.2f·k^%.2f): the lead is the fit's noise, not the step's",
			target.P, target.D, target.Goodput, cur.Goodput, f.StepSigma, gt, gc, g.StepA, g.StepB, g.StepP, f.StepA, f.StepB, f.StepP)
	}
	return ""
}

// uncertainSlopeErrors is how many standard errors either side of the
// fitted slope a move's lead must hold at (uncertainFit): about the 87%
// interval. At two (95%) the bound also held a right move of a run whose
// fit was clean enough (σ 1.6 ms over batches 0.5–5: 6P:2D predicted
// 7.35 req/s against 6.27, 6.19 against 6.26 at the steeper bound), and
// over windows with 2–5 ms of scrape noise half the right moves waited;
// at one and a half none did, and no move toward the decodes passed at
// 7–10 ms of noise.
const uncertainSlopeErrors = 1.5

// slopeError is the standard error of the slope b of tpot = a + b·k^p
// fitted by least squares to the batches ks with residual sigma (ms),
// and the points' mean k^p the curve turns about; 0s for fewer than three
// points or no spread of k^p.
func slopeError(ks []float64, p, sigma float64) (se, pivot float64) {
	if len(ks) < 3 {
		return 0, 0
	}
	xs := make([]float64, len(ks))
	for i, k := range ks {
		xs[i] = math.Pow(k, p)
	}
	mx := Mean(xs)
	var sxx float64
	for _, x := range xs {
		sxx += (x - mx) * (x - mx)
	}
	if sxx <= 0 {
		return 0, mx
	}
	return sigma / math.Sqrt(sxx), mx
}
