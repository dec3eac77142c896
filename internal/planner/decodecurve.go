package planner

import "math"

// A decode step's time grows with its batch k less than in proportion: a
// step reads the weights once whatever k, and the batch adds only its
// sequences' own work (their attention, their share of the matrix
// products, which batch better the more rows they have). The planner
// fits TPOT = A + B·k^P ms with 0 < P ≤ 1. Points from a narrow range of
// batches (a lightly loaded decode runs 1–2 sequences) cannot tell A from
// B, nor P: a line through batches 1 and 2 of the built-in simulated
// engine (6.9 and 9.3 ms) predicts 43 ms at 16, where it takes 15.8–18.6.
// There the planner takes the prior's shape, A/B = priorStepRatio and P =
// priorStepExponent, scaled to the points; from batches spanning
// minStepSpan× and more it fits A and B at the prior's P, and from
// freeStepSpan× and more (or where another P fits the points with a
// quarter of the squared error) all three. Fitted freely to a few noisy points
// from batches 1–4, P swung between 0.25 and 1 decision by decision, and
// with it the decodes' predicted capacity by half.
//
// The prior is the decode grid of the simulated engines' built-in profile
// (a 135M-parameter Llama measured with `tandem profile` on a 2-core
// AMD EPYC, contexts of 128 tokens, batches 1–16): 6.9 + 1.23·k^0.8 ms.
const (
	priorStepRatio    = 5.6
	priorStepExponent = 0.8
	minStepSpan       = 3
	freeStepSpan      = 8
)

// stepExponents are the exponents P a free fit tries.
var stepExponents = func() []float64 {
	var ps []float64
	for i := 4; i <= 20; i++ {
		ps = append(ps, float64(i)/20)
	}
	return ps
}()

// fitDecodeCurve fits TPOT = a + b·k^p ms to the points (batch ks,
// TPOTs ms): kind "fit" when the batches span minStepSpan× and more (a
// and b by least squares at the prior's exponent, or at the exponent with
// the least squared error from freeStepSpan× or where it has a quarter of
// the prior exponent's, with a ≥ 0 and b > 0),
// else "prior" (the prior's shape through the points by least squares). sigma
// is the points' spread about it (robustSigma). Points more than three
// spreads above or below it (scrape windows with long local prefills in
// their steps) are left out and the curve fitted again, once, unless that
// would leave out half of them.
func fitDecodeCurve(ks, tpots []float64) (kind string, a, b, p, sigma float64) {
	kind, a, b, p, sigma = fitDecodeOnce(ks, tpots)
	if kind == "" || sigma <= 0 {
		return kind, a, b, p, sigma
	}
	var keptK, keptT []float64
	for i, k := range ks {
		if math.Abs(tpots[i]-a-b*math.Pow(k, p)) <= 3*sigma {
			keptK, keptT = append(keptK, k), append(keptT, tpots[i])
		}
	}
	if len(keptK) == len(ks) || 2*len(keptK) <= len(ks) {
		return kind, a, b, p, sigma
	}
	return fitDecodeOnce(keptK, keptT)
}

func fitDecodeOnce(ks, tpots []float64) (kind string, a, b, p, sigma float64) {
	lo, hi := math.Inf(1), 0.0
	for _, k := range ks {
		lo, hi = min(lo, k), max(hi, k)
	}
	if len(ks) >= 3 && hi >= minStepSpan*lo {
		line := func(pp float64) (a, b, sse float64, ok bool) {
			xs := make([]float64, len(ks))
			for i, k := range ks {
				xs[i] = math.Pow(k, pp)
			}
			a, b, s, ok := FitLine(xs, tpots)
			return a, b, s * s, ok && a >= 0 && b > 0
		}
		priorErr := math.Inf(1)
		if fa, fb, sse, ok := line(priorStepExponent); ok {
			kind, a, b, p, priorErr = "fit", fa, fb, priorStepExponent, sse
		}
		// Another exponent where the batches span enough, or where it
		// explains the points far better than the prior's.
		bestErr := priorErr
		for _, pp := range stepExponents {
			fa, fb, sse, ok := line(pp)
			if ok && sse < bestErr && (hi >= freeStepSpan*lo || sse <= priorErr/4) {
				kind, a, b, p, bestErr = "fit", fa, fb, pp, sse
			}
		}
		if kind != "" {
			return kind, a, b, p, robustSigma(ks, tpots, a, b, p)
		}
	}
	// b·(priorStepRatio + k^P) through the points: b = Σ g·y / Σ g².
	var gy, gg float64
	for i, k := range ks {
		g := priorStepRatio + math.Pow(k, priorStepExponent)
		gy += g * tpots[i]
		gg += g * g
	}
	if gg <= 0 {
		return "", 0, 0, 1, 0
	}
	b = gy / gg
	a, p = priorStepRatio*b, priorStepExponent
	return "prior", a, b, p, robustSigma(ks, tpots, a, b, p)
}

// robustSigma is the spread of the points about a + b·k^p: the median
// absolute residual scaled to a normal's standard deviation (×1.4826), 0
// for fewer than three points. A scrape window whose steps carried long
// local prefills sits far above the curve; the stall model counts those
// stalls (stalls.go), and a standard deviation would count them again as
// step noise, enough at a loaded colocated engine to predict no batch
// within the TPOT objective.
func robustSigma(ks, tpots []float64, a, b, p float64) float64 {
	if len(ks) < 3 {
		return 0
	}
	res := make([]float64, len(ks))
	for i, k := range ks {
		res[i] = math.Abs(tpots[i] - a - b*math.Pow(k, p))
	}
	return 1.4826 * median(res)
}

// stepMs is the fit's decode step (ms) at batch k: the fitted curve
// within the batches observed, and past the largest of them
// (Fit.StepBatchMax, when known) the step there grown as the prior's
// shape grows (priorShape) or, where the batches seen reach
// freeStepSpan, along the curve's slope over their upper half if that
// grows more. The fitted curve past its points extrapolates whatever
// shaped it, either way: a concave fit over batches 1–16 dominated by the
// step's jump from 1 to 2 (the simulated engine at long contexts) comes
// out with an exponent of 0.3, a step nearly flat past 16, and rated a
// decode at twice the batch it carries within the TPOT objective; a line
// through batches 1–3 and the same jump rises past 16 three times too
// steeply, and rated a decode at a fifth. A decode step is the weights
// read once and each sequence's own work: the prior's shape, and no less
// than the per-sequence cost measured across the larger batches seen
// (below freeStepSpan a slope is the small-batch regime's, or the jump's).
func (f Fit) stepMs(k float64) float64 {
	top := f.StepBatchMax
	if top <= 0 || k <= top {
		return f.curveMs(k)
	}
	at := f.curveMs(top)
	step := at * priorShape(k) / priorShape(top)
	if top >= freeStepSpan {
		slope := (at - f.curveMs(top/2)) / (top / 2)
		step = max(step, at+slope*(k-top))
	}
	return step
}

// StepMs is the decode step (ms) the model prices at batch k: the fitted
// curve within the batches observed, extrapolated past them (stepMs).
func (f Fit) StepMs(k float64) float64 { return f.stepMs(k) }

// curveMs is the fitted curve A + B·k^P (ms) at batch k.
func (f Fit) curveMs(k float64) float64 {
	p := f.StepP
	if p <= 0 {
		p = 1
	}
	return f.StepA + f.StepB*math.Pow(max(k, 0), p)
}

// priorShape is the prior's step at batch k, to scale: priorStepRatio +
// k^priorStepExponent.
func priorShape(k float64) float64 {
	return priorStepRatio + math.Pow(max(k, 0), priorStepExponent)
}

// batchAtSLO is the batch k* whose step meets slo ms for q of the steps:
// stepMs solved for k at slo − z·σ (DecodeBatchAtSLO for a line), at
// most maxSeqs, 0 when no batch does.
func (f Fit) batchAtSLO(slo, q float64, maxSeqs int) float64 {
	if slo <= 0 || f.StepB <= 0 {
		return float64(maxSeqs)
	}
	z := math.Sqrt2 * math.Erfinv(2*q-1)
	target := slo - z*f.StepSigma
	if target <= f.StepA {
		return 0
	}
	seats := float64(maxSeqs)
	if f.stepMs(seats) <= target {
		return seats
	}
	lo, hi := 0.0, seats // stepMs grows with k
	for range 60 {
		if mid := (lo + hi) / 2; f.stepMs(mid) <= target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}
