package planner

import "fmt"

// trustBatches is how far past the largest batch the decode points span
// (Fit.StepBatchMax) a move may run the decodes on the model's word: the
// step curve is measured up to that batch and extrapolated beyond it
// (stepMs), and a move whose lead rests on a decode at several times the
// batches measured is a bet on the extrapolation. From the colocated
// start, four decodes of the P/D experiment's long mix (1,024–2,048-token
// prompts) ran at batches 0.5–2 in the first window, and the model, with
// every split predicted within 20% of the others (3–5 req/s), moved to
// 3P:1D at the first decision: its one decode at batch 16 and more, whose
// steps at those contexts (the simulated engine's measured profile) the
// curve through batches 0.5–2 priced at 18 ms where the level's streams
// met 19.5–27 ms. The 16 req/s level met 79% there, where colocated meets
// 90% (TTFT ×2). Within twice the measured batch the curve's slope over
// the points carries the move (a step of one engine from D decodes to
// D − 1 raises a decode's batch by D/(D − 1), at most twice); a split
// beyond it is reached one measured step at a time.
const trustBatches = 2

// unmeasuredBatch says why a move from the current split cur (modelled by
// curM) to the split next (modelled by nm) rests on decode batches the fit
// has not measured, "" when it does not: at the load cur is valued to
// carry (its goodput), next's decodes run at more than trustBatches times
// both the largest batch the decode points span and the batch cur's
// decodes run at there (cur's own valuation rests on the curve out to
// that batch). The load is the same for both, so the batches differ by the
// split alone (a decode-starved split's few decodes each carrying many
// streams), not by the higher rate next is predicted to carry; and a step
// of one engine (a batch a third or a half larger) is not held where the
// current split is itself valued past the batches measured (the chat mix's
// bursts of 60 hold four decodes at 15 streams each, measured at 6–9:
// held against the measured batch alone, every step from 0P:4D to 1P:3D
// waited through the level). A move toward more decodes (smaller batches)
// is never held, nor one away from a split that meets the objectives at
// no rate.
func (pl *Planner) unmeasuredBatch(f Fit, curM *capacity, cur Split, nm *capacity, next Split) string {
	if f.StepBatchMax <= 0 || cur.Goodput <= 0 || nm == nil || curM == nil || next.D <= 0 {
		return ""
	}
	nb := nm.attainment(next.P, next.D, cur.Goodput).batch
	cb := curM.attainment(cur.P, cur.D, cur.Goodput).batch
	if nb <= trustBatches*max(f.StepBatchMax, cb) {
		return ""
	}
	return fmt.Sprintf("unmeasured batch: %dP:%dD is predicted %.2f req/s against %.2f now, its decodes at batch %.1f at the current split's %.2f req/s (%.1f now), past %d× that and the largest the decode step was measured at (%.1f): the step there is the curve's extrapolation",
		next.P, next.D, next.Goodput, cur.Goodput, nb, cur.Goodput, cb, trustBatches, f.StepBatchMax)
}

// split is the split of splits with p prefill engines (zero when none is).
func split(splits []Split, p int) Split {
	for _, s := range splits {
		if s.P == p {
			return s
		}
	}
	return Split{}
}

// splitModel is the model the split of splits with p prefill engines is
// valued by: the colocated one at p = 0, else the one at the threshold
// that split is valued at; nil when splits holds none with p.
func splitModel(splits []Split, p int, colo *capacity, ths *thresholds) *capacity {
	s := split(splits, p)
	switch {
	case s.D == 0:
		return nil
	case p == 0:
		return colo
	}
	return ths.model(s.Threshold)
}
