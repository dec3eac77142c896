package bench

import (
	"math"
	"slices"
)

// Summary describes a distribution of latencies in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	Std  float64 `json:"std_ms"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize returns the summary of xs (which it does not modify). Percentiles
// interpolate linearly between closest ranks, like numpy.percentile's
// default, which vLLM's benchmark uses. An empty xs gives the zero Summary.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	var ss float64
	for _, x := range s {
		ss += (x - mean) * (x - mean)
	}
	return Summary{
		N:    len(s),
		Mean: mean,
		Std:  math.Sqrt(ss / float64(len(s))), // population, as numpy.std
		Min:  s[0],
		P50:  Percentile(s, 50),
		P90:  Percentile(s, 90),
		P99:  Percentile(s, 99),
		Max:  s[len(s)-1],
	}
}

// Percentile returns the p-th percentile (0 <= p <= 100) of sorted, an
// ascending slice, interpolating linearly between the two closest ranks. It
// returns NaN for an empty slice and clamps p to [0, 100].
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	p = min(max(p, 0), 100)
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	frac := rank - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}
