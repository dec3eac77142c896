package planner

import (
	"math"
	"slices"
)

// A stream's TPOT is the mean step over its own life, and the batch it
// lives through is not the window's mean: streams come and go around it.
// Taking a decode's arrivals as Poisson and its streams' lives as the
// window's outputs (an M/G/∞ system, the seats bounding it), the number
// of streams N(t) beside a tagged one has covariance λ·E[(S−u)⁺] at lag u
// (S a stream's life), so the mean of N over a life of t steps has
// variance
//
//	Var = (2λ/t²) ∫₀ᵗ (t−u)·E[(S−u)⁺] du = h(t)·L
//
// with L = λ·E[S] the mean batch (Little's law): h is 2/3 for a stream
// as long as every other, 1 for a short one (its batch is one draw of a
// Poisson count), less for a long one. A decode run at a mean batch whose
// step just meets the objective then has about half its streams over it;
// the model counts the streams whose mean batch puts their mean step past
// the objective (stepMiss). Load-aware picking across decodes evens their
// batches out and smooths this; arrivals in bursts widen it (the bursts
// are capacity.decodeAt's).

// spreadStreams is how many streams, at the quantiles of the window's
// outputs, stand for a decode's streams in the spread of their batches.
const spreadStreams = 8

// lifeSpread is h for spreadStreams streams at the quantiles of outputs
// (tokens; a stream lives one step per token after its first): the
// variance of the mean batch over each one's life per unit of mean batch.
// Nil for no outputs.
func lifeSpread(outputs []float64) []float64 {
	if len(outputs) == 0 {
		return nil
	}
	lives := sortedLives(outputs)
	n := float64(len(lives))
	suffix := make([]float64, len(lives)+1) // suffix[i] = Σ lives[i:]
	for i := len(lives) - 1; i >= 0; i-- {
		suffix[i] = suffix[i+1] + lives[i]
	}
	mean := suffix[0] / n
	// excess is E[(S−u)⁺]: the lives longer than u, less u each.
	excess := func(u float64) float64 {
		i, _ := slices.BinarySearch(lives, u)
		for i < len(lives) && lives[i] <= u {
			i++
		}
		return (suffix[i] - u*float64(len(lives)-i)) / n
	}
	const steps = 64
	hs := make([]float64, spreadStreams)
	for q := range hs {
		t := lives[min(int((float64(q)+0.5)/spreadStreams*n), len(lives)-1)]
		var integral float64
		du := t / steps
		for j := range steps {
			u := (float64(j) + 0.5) * du
			integral += (t - u) * excess(u) * du
		}
		hs[q] = 2 * integral / (mean * t * t)
	}
	return hs
}

// burstHeld is, for spreadStreams streams at the quantiles of outputs
// (as lifeSpread's), the mean share of a burst's streams still decoding
// over each one's life when the burst's streams start together: a stream
// of t steps sees the batch fall as the shorter ones finish, its mean
// batch the burst's times E[min(S, t)]/t (S the streams' lives). Nil for
// no outputs.
func burstHeld(outputs []float64) []float64 {
	if len(outputs) == 0 {
		return nil
	}
	lives := sortedLives(outputs)
	n := float64(len(lives))
	held := make([]float64, spreadStreams)
	for q := range held {
		t := lives[min(int((float64(q)+0.5)/spreadStreams*n), len(lives)-1)]
		var sum float64
		for _, l := range lives {
			sum += min(l, t)
		}
		held[q] = sum / (n * t)
	}
	return held
}

// stepMiss is the fraction of a decode's streams whose mean step over
// their lives exceeds slo (s) at a mean batch of batch, the batch held
// at most most (a burst's share, capacity.burstShare): each stream of
// lifeSpread's at a mean batch normal about batch with variance h·batch,
// its step (stepMs, linearised over ±1 standard deviation of them all)
// with the fit's residual σ beside it. A decode held at most by a burst
// holds it only while the burst's streams start: each stream lives
// through the burst's streams finishing, at a mean batch of burstHeld's
// share of it.
func (m *capacity) stepMiss(batch, most, slo float64) float64 {
	f := m.f
	sigma := f.StepSigma / 1000
	tailAt := func(step, sd float64) float64 {
		if sd <= 0 {
			if step > slo {
				return 1
			}
			return 0
		}
		return 0.5 * math.Erfc((slo-step)/(sd*math.Sqrt2))
	}
	step := f.stepMs(batch) / 1000
	tail := func(sd float64) float64 { return tailAt(step, sd) }
	if len(m.held) > 0 && batch > 1 && batch >= most*(1-1e-9) {
		var miss float64
		for _, h := range m.held {
			miss += tailAt(f.stepMs(max(batch*h, 1))/1000, sigma)
		}
		return miss / float64(len(m.held))
	}
	if len(m.spread) == 0 || batch <= 0 {
		return tail(sigma)
	}
	hi := min(most, float64(m.cfg.MaxSeqs))
	// The step's slope over ±1 standard deviation of the streams' mean
	// batch taken together (one secant: a decision weighs this thousands
	// of times), then each stream's spread along it.
	var slope float64
	if sd := math.Sqrt(m.spreadMean * batch); batch < hi {
		if up, down := min(batch+sd, hi), max(batch-sd, 1); up > down {
			slope = (f.stepMs(up) - f.stepMs(down)) / 1000 / (up - down)
		}
	}
	var miss float64
	for _, h := range m.spread {
		miss += tail(math.Hypot(sigma, slope*math.Sqrt(h*batch)))
	}
	return miss / float64(len(m.spread))
}

// sortedLives is the streams' lives in steps for outputs (tokens; a stream
// lives one step per token after its first, at least one), in ascending
// order.
func sortedLives(outputs []float64) []float64 {
	lives := make([]float64, len(outputs))
	for i, o := range outputs {
		lives[i] = max(o-1, 1)
	}
	slices.Sort(lives)
	return lives
}
