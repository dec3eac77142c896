package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// softmax64 returns e^((x-max)·invT) normalized, in float64, with NaN as
// -Inf.
func softmax64(x []float32, invT float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		if v == v {
			m = max(m, float64(v))
		}
	}
	p := make([]float64, len(x))
	var z float64
	for i, v := range x {
		if v == v {
			p[i] = math.Exp((float64(v) - m) * invT)
			z += p[i]
		}
	}
	for i := range p {
		p[i] /= z
	}
	return p
}

func TestExpRowMatchesFloat64Softmax(t *testing.T) {
	nan := float32(math.NaN())
	withAt := func(x []float32, at map[int]float32) []float32 {
		x = slices.Clone(x)
		for i, v := range at {
			x[i] = v
		}
		return x
	}
	base := randomLogits(31, 10000, 2.5)
	tests := []struct {
		name string
		x    []float32
		invT float32
	}{
		{"temperature 1", base, 1},
		{"temperature 0.8", base, 1.25},
		{"temperature 2", base, 0.5},
		{"temperature 0.1 finds the maximum first", base, 10},
		{"NaN logits count as -Inf", withAt(base, map[int]float32{0: nan, 17: nan, 9999: nan}), 1.25},
		{"-Inf logits weigh 0", withAt(base, map[int]float32{3: negInf, 4: negInf}), 1},
		// A maximum far above every sampled logit overflows with the
		// estimated shift (index 1 is never in the sample).
		{"a maximum the sample misses", withAt(base, map[int]float32{1: 100}), 1},
		{"a maximum the sample misses, cooled", withAt(base, map[int]float32{1: 40}), 3},
		{"a short row", []float32{0.5, -1, 2}, 1.25},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r expRow
			r.fill(tc.x, tc.invT)
			if !r.ok {
				t.Fatalf("fill reports no finite maximum")
			}
			n := len(tc.x)
			if len(r.w) != padded(n) || slices.ContainsFunc(r.w[n:], func(v float32) bool { return v != 0 }) {
				t.Fatalf("weights not zero-padded to %d: len %d", padded(n), len(r.w))
			}
			var sum float64
			for _, v := range r.w[:n] {
				sum += float64(v)
			}
			if math.Abs(sum-r.total) > 1e-6*sum {
				t.Errorf("total %v, weights sum to %v", r.total, sum)
			}
			want := softmax64(tc.x, float64(tc.invT))
			for i, v := range r.w[:n] {
				if x := tc.x[i]; x != x || x == negInf {
					if v != 0 {
						t.Fatalf("w[%d] = %v for logit %v, want 0", i, v, x)
					}
					continue
				}
				// The exponent x·invT - shift is formed in float32, so
				// its rounding, not the exponential's few ulp, bounds the
				// error of a weight far below the maximum.
				y := float64(tc.x[i] * tc.invT)
				tol := 5e-7 + 1.2e-7*(math.Abs(y)+math.Abs(y-float64(r.shift)))
				if got := float64(v) / r.total; !(math.Abs(got-want[i]) <= tol*want[i]+1e-35) {
					t.Fatalf("p[%d] = %v, want %v", i, got, want[i])
				}
			}
		})
	}
}

func TestExpRowWithoutFiniteMaximum(t *testing.T) {
	inf := float32(math.Inf(1))
	tests := []struct {
		name string
		x    []float32
		max  float32
	}{
		{"+Inf", []float32{1, inf, 2, inf}, inf},
		{"all -Inf", []float32{negInf, negInf, negInf}, negInf},
		{"all NaN or -Inf", []float32{float32(math.NaN()), negInf}, negInf},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r expRow
			r.fill(tc.x, 1.25)
			if r.ok || r.max != tc.max {
				t.Errorf("ok = %v, max = %v; want false, %v", r.ok, r.max, tc.max)
			}
		})
	}
}

// gridCounts draws with u = (i+0.5)/n for i < n and counts the tokens.
func gridCounts(n int, drawAt func(u float64) int32) map[int32]int {
	counts := map[int32]int{}
	for i := range n {
		counts[drawAt((float64(i)+0.5)/float64(n))]++
	}
	return counts
}

// checkInverseCDF checks that counts from gridCounts follow the weights
// of an inverse-CDF draw: each token owns an interval of u as long as its
// share, so it gets its share of the n grid points give or take one.
func checkInverseCDF(t *testing.T, counts map[int32]int, weights map[int32]float64, n int) {
	t.Helper()
	var z float64
	for _, w := range weights {
		z += w
	}
	for tok := range counts {
		if weights[tok] == 0 {
			t.Fatalf("drew token %d, which has no weight", tok)
		}
	}
	for tok, w := range weights {
		if want := float64(n) * w / z; math.Abs(float64(counts[tok])-want) > 1.01 {
			t.Errorf("token %d: %d draws on the grid, want %.2f ± 1", tok, counts[tok], want)
		}
	}
}

func TestDrawDenseAndDrawAreTheSameInverseCDF(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{1, 7, 256, 1000, 5000} {
		w := make([]float32, padded(n))
		weights := map[int32]float64{}
		var cs []cand
		for i := range n {
			if r.IntN(4) == 0 {
				continue // some tokens weigh nothing
			}
			w[i] = float32(math.Exp(r.NormFloat64() * 2))
			weights[int32(i)] = float64(w[i])
			cs = append(cs, cand{w: w[i], id: int32(i)})
		}
		if len(cs) == 0 {
			continue
		}
		r.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		sc := getScratch(n)
		const grid = 20000
		counts := gridCounts(grid, func(u float64) int32 {
			tok := drawDense(w, u, sc)
			if got := draw(cs, u); got != tok {
				t.Fatalf("n=%d u=%v: drawDense %d, draw over the shuffled list %d", n, u, tok, got)
			}
			return tok
		})
		putScratch(sc)
		checkInverseCDF(t, counts, weights, grid)
	}
}

func TestDrawOfWeightlessCandidatesTakesTheFirst(t *testing.T) {
	if got := draw([]cand{{w: 0, id: 9}, {w: 0, id: 3}}, 0.5); got != 9 {
		t.Errorf("draw = %d, want 9", got)
	}
}
