package planner

import (
	"math"
	"slices"
	"time"
)

// PrefillSample is one measured prefill: an engine computed Tokens prompt
// tokens in Seconds, from being scheduled to its first token. Local says a
// decode engine prefilled its own prompt (a conditional decision kept it
// local); otherwise a prefill engine computed it for another.
type PrefillSample struct {
	At      time.Time
	URL     string
	Tokens  int
	Seconds float64
	Local   bool
}

// PrefillCurve is a prefill's time by its uncached tokens n: A + B·n +
// C·n² seconds. A is what every step costs whatever its tokens (a forward
// pass through the weights at least once, the scheduling), B the per-token
// work and C the attention's growth with the prompt (n²/2 query-key
// pairs); none is negative.
type PrefillCurve struct {
	A float64 `json:"a_seconds"`
	B float64 `json:"b_seconds_per_token"`
	C float64 `json:"c_seconds_per_token2"`
	// Source is where the curve comes from: "measured" (fitted to the
	// window's prefill samples), "measured per-token" (the samples' lengths
	// too alike to tell a curve: their seconds per token) or "scraped"
	// (too few samples: the engines' scraped per-token cost).
	Source string `json:"source"`
	// Samples counts the prefill samples it was fitted to.
	Samples int `json:"samples"`
}

// Seconds is the curve's prefill time of n tokens (0 for none).
func (c PrefillCurve) Seconds(n float64) float64 {
	if n <= 0 {
		return 0
	}
	return c.A + c.B*n + c.C*n*n
}

// Tokens is the longest prompt the curve prefills within sec seconds (0
// when none).
func (c PrefillCurve) Tokens(sec float64) int {
	if sec <= c.A {
		return 0
	}
	if c.B <= 0 && c.C <= 0 {
		return math.MaxInt32
	}
	rest := sec - c.A
	var n float64
	if c.C > 0 {
		n = (-c.B + math.Sqrt(c.B*c.B+4*c.C*rest)) / (2 * c.C)
	} else {
		n = rest / c.B
	}
	return int(min(n, math.MaxInt32))
}

// PerToken is the curve's mean cost per token over a prompt of n tokens.
func (c PrefillCurve) PerToken(n float64) float64 {
	if n <= 0 {
		return c.B
	}
	return c.Seconds(n) / n
}

// Bounds on the prefill samples: the fewest a curve is fitted to (else the
// scraped per-token cost), and the most kept (the latest).
const (
	minPrefillSamples = 8
	maxPrefillSamples = 4096
)

// ObservePrefill records a measured prefill. The planner fits its prefill
// curve to the window's samples (the prefill engines' when it has enough
// of them, every sample's otherwise) and falls back to the engines'
// scraped per-token cost with too few.
func (pl *Planner) ObservePrefill(s PrefillSample) {
	if s.Tokens <= 0 || !(s.Seconds > 0) || math.IsInf(s.Seconds, 0) {
		return
	}
	pl.prefills = append(pl.prefills, s)
	if n := len(pl.prefills); n > 2*maxPrefillSamples {
		pl.prefills = slices.Delete(pl.prefills, 0, n-maxPrefillSamples)
	}
}

// prefillCurve fits the curve to the window's prefill samples from since
// on, or takes the scraped per-token cost perToken with too few.
func (pl *Planner) prefillCurve(since time.Time, perToken float64) PrefillCurve {
	var remote, all []PrefillSample
	for _, s := range pl.prefills[max(len(pl.prefills)-maxPrefillSamples, 0):] {
		if s.At.Before(since) {
			continue
		}
		all = append(all, s)
		if !s.Local {
			remote = append(remote, s)
		}
	}
	// A prefill engine's prompts are the remote path's cost; a decode's
	// own include the decode steps it shares them with, which the model
	// adds itself, so they stand in only where the prefill engines
	// measured too few.
	use := remote
	if len(use) < minPrefillSamples {
		use = all
	}
	if len(use) < minPrefillSamples {
		return PrefillCurve{B: perToken, Source: "scraped"}
	}
	xs, ys := lowerEnvelope(use)
	if c, ok := fitPrefillCurve(xs, ys); ok {
		c.Source, c.Samples = "measured", len(use)
		return c
	}
	return PrefillCurve{B: Sum(ys) / Sum(xs), Source: "measured per-token", Samples: len(use)}
}

// lowerEnvelope is the samples' lengths and times with the contended ones
// left out: per band of lengths (half an octave), those at most the band's
// lower quartile of time. A prefill measured on a busy engine shares its
// steps with other prompts and decodes and takes longer than the same
// prompt alone; the model wants the latter, its service time, and adds
// the queueing itself.
func lowerEnvelope(samples []PrefillSample) (xs, ys []float64) {
	bands := map[int][]PrefillSample{}
	for _, s := range samples {
		b := int(math.Floor(2 * math.Log2(float64(s.Tokens))))
		bands[b] = append(bands[b], s)
	}
	for _, band := range bands {
		secs := make([]float64, len(band))
		for i, s := range band {
			secs[i] = s.Seconds
		}
		slices.Sort(secs)
		q := secs[(len(secs)-1)/4]
		for _, s := range band {
			if s.Seconds <= q {
				xs, ys = append(xs, float64(s.Tokens)), append(ys, s.Seconds)
			}
		}
	}
	return xs, ys
}

// fitPrefillCurve is the least-squares curve a + b·x + c·x² through the
// points with no coefficient negative: of the fits on every subset of the
// three terms whose coefficients are all non-negative, the one with the
// least squared error. The errors are relative (each point weighted by
// 1/y²): the short prompts, most of a chat mix, are priced as well as
// the long ones rather than left to the long ones' absolute residuals. ok is false when the xs span too little to tell a
// curve from a constant (the longest under twice the shortest, or fewer
// than three distinct lengths).
func fitPrefillCurve(xs, ys []float64) (PrefillCurve, bool) {
	lo, hi := slices.Min(xs), slices.Max(xs)
	distinct := len(slices.Compact(slices.Sorted(slices.Values(xs))))
	if hi < 2*lo || distinct < 3 {
		return PrefillCurve{}, false
	}
	// Scaled lengths keep the normal equations well conditioned.
	scale := hi
	best, bestErr := PrefillCurve{}, math.Inf(1)
	for mask := 1; mask < 8; mask++ {
		var terms []int
		for j := range 3 {
			if mask&(1<<j) != 0 {
				terms = append(terms, j)
			}
		}
		coef, ok := leastSquares(xs, ys, scale, terms)
		if !ok || slices.ContainsFunc(coef, func(v float64) bool { return v < 0 }) {
			continue
		}
		var full [3]float64
		for i, j := range terms {
			full[j] = coef[i] / math.Pow(scale, float64(j))
		}
		c := PrefillCurve{A: full[0], B: full[1], C: full[2]}
		var sse float64
		for i := range xs {
			r := (ys[i] - c.Seconds(xs[i])) / ys[i]
			sse += r * r
		}
		if sse < bestErr*(1-1e-9) {
			best, bestErr = c, sse
		}
	}
	return best, !math.IsInf(bestErr, 1)
}

// leastSquares solves for the coefficients of the powers terms of x/scale
// that best fit ys in relative error (weighted normal equations, Gaussian elimination with partial
// pivoting); ok is false when they are singular.
func leastSquares(xs, ys []float64, scale float64, terms []int) ([]float64, bool) {
	n := len(terms)
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n+1)
	}
	for k := range xs {
		u := xs[k] / scale
		w := 1 / (ys[k] * ys[k]) // relative errors
		for i, ti := range terms {
			pi := math.Pow(u, float64(ti))
			for j, tj := range terms {
				m[i][j] += w * pi * math.Pow(u, float64(tj))
			}
			m[i][n] += w * pi * ys[k]
		}
	}
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[p][c]) {
				p = r
			}
		}
		if math.Abs(m[p][c]) < 1e-12 {
			return nil, false
		}
		m[c], m[p] = m[p], m[c]
		for r := range n {
			if r == c {
				continue
			}
			f := m[r][c] / m[c][c]
			for j := c; j <= n; j++ {
				m[r][j] -= f * m[c][j]
			}
		}
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = m[i][n] / m[i][i]
	}
	return out, true
}
