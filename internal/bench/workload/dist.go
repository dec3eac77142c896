package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of lengths in tokens (or of durations in
// milliseconds, for think times). Draws are rounded and clamped to
// [Min, Max].
type Dist struct {
	// Kind is "fixed", "uniform", "normal" or "lognormal".
	Kind string `json:"kind"`
	// A and B are the parameters: fixed N (A); uniform over [A, B];
	// normal with mean A and standard deviation B; lognormal with median A
	// and shape sigma B (the standard deviation of the log).
	A float64 `json:"a"`
	B float64 `json:"b,omitempty"`
	// Min and Max clamp every draw; Max 0 means no upper bound.
	Min int `json:"min"`
	Max int `json:"max,omitempty"`
}

// Fixed is the distribution that is always n.
func Fixed(n int) Dist { return Dist{Kind: "fixed", A: float64(n), Min: n, Max: n} }

// ParseDist parses "N" or "fixed:N", "uniform:MIN:MAX", "normal:MEAN:STD",
// "lognormal:MEDIAN:SIGMA"; normal and lognormal take optional ":MIN:MAX"
// clamps (default 1 and no upper bound).
func ParseDist(s string) (Dist, error) {
	bad := func(why string) (Dist, error) {
		return Dist{}, fmt.Errorf("length distribution %q: %s (want N, fixed:N, uniform:MIN:MAX, normal:MEAN:STD[:MIN:MAX] or lognormal:MEDIAN:SIGMA[:MIN:MAX])", s, why)
	}
	parts := strings.Split(s, ":")
	kind := parts[0]
	if len(parts) == 1 {
		kind, parts = "fixed", []string{"fixed", s}
	}
	nums := make([]float64, len(parts)-1)
	for i, p := range parts[1:] {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return bad(fmt.Sprintf("%q is not a number", p))
		}
		nums[i] = f
	}
	intOf := func(f float64) (int, bool) { return int(f), f == math.Trunc(f) && f >= 0 && f < 1<<31 }
	var d Dist
	switch kind {
	case "fixed":
		if len(nums) != 1 {
			return bad("fixed takes one number")
		}
		n, ok := intOf(nums[0])
		if !ok || n < 1 {
			return bad("the length must be a positive integer")
		}
		return Fixed(n), nil
	case "uniform":
		if len(nums) != 2 {
			return bad("uniform takes MIN:MAX")
		}
		lo, ok1 := intOf(nums[0])
		hi, ok2 := intOf(nums[1])
		if !ok1 || !ok2 || lo < 1 || hi < lo {
			return bad("want integers 1 <= MIN <= MAX")
		}
		return Dist{Kind: "uniform", A: float64(lo), B: float64(hi), Min: lo, Max: hi}, nil
	case "normal", "lognormal":
		if len(nums) != 2 && len(nums) != 4 {
			return bad(kind + " takes two parameters and optionally MIN:MAX")
		}
		d = Dist{Kind: kind, A: nums[0], B: nums[1], Min: 1}
		if len(nums) == 4 {
			lo, ok1 := intOf(nums[2])
			hi, ok2 := intOf(nums[3])
			if !ok1 || !ok2 || lo < 1 || hi < lo {
				return bad("want integers 1 <= MIN <= MAX")
			}
			d.Min, d.Max = lo, hi
		}
		if d.A <= 0 || d.B < 0 {
			return bad("the mean or median must be positive and the spread non-negative")
		}
		return d, nil
	}
	return bad("unknown kind " + strconv.Quote(kind))
}

// String is the form ParseDist reads.
func (d Dist) String() string {
	g := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	switch d.Kind {
	case "fixed":
		return g(d.A)
	case "uniform":
		return fmt.Sprintf("uniform:%s:%s", g(d.A), g(d.B))
	}
	s := fmt.Sprintf("%s:%s:%s", d.Kind, g(d.A), g(d.B))
	if d.Max > 0 {
		s += fmt.Sprintf(":%d:%d", d.Min, d.Max)
	}
	return s
}

// Draw returns one length from d using r.
func (d Dist) Draw(r *rand.Rand) int {
	var x float64
	switch d.Kind {
	case "fixed", "":
		x = d.A
	case "uniform":
		return int(d.A) + r.IntN(int(d.B-d.A)+1)
	case "normal":
		x = d.A + d.B*r.NormFloat64()
	case "lognormal":
		x = d.A * math.Exp(d.B*r.NormFloat64())
	}
	n := int(math.Round(x))
	n = max(n, d.Min, 1)
	if d.Max > 0 {
		n = min(n, d.Max)
	}
	return n
}

// Mean is the distribution's mean before clamping (for fixed and uniform,
// exact).
func (d Dist) Mean() float64 {
	switch d.Kind {
	case "uniform":
		return (d.A + d.B) / 2
	case "lognormal":
		return d.A * math.Exp(d.B*d.B/2)
	}
	return d.A
}

// Bound is the largest length d can draw, or 0 when it has no bound.
func (d Dist) Bound() int {
	switch d.Kind {
	case "fixed", "uniform":
		return int(max(d.A, d.B))
	}
	return d.Max
}
