package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// randomCands returns n candidates with ids 0..n-1 in random order and
// weights drawn by kind: spread over many powers of two, crowded into a few
// values (ties), or with some zeros.
func randomCands(r *rand.Rand, n int, kind string) []cand {
	cs := make([]cand, n)
	for i := range cs {
		var w float32
		switch kind {
		case "spread":
			w = float32(math.Exp(r.NormFloat64() * 4))
		case "ties":
			w = float32(1 + r.IntN(5))
		case "zeros":
			if r.IntN(3) > 0 {
				w = float32(r.Float64())
			}
		}
		cs[i] = cand{w: w, id: int32(i)}
	}
	r.Shuffle(n, func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	return cs
}

// sortedByWeight is cs in the order top-p counts in: descending weight,
// ascending id.
func sortedByWeight(cs []cand) []cand {
	s := slices.Clone(cs)
	slices.SortFunc(s, func(a, b cand) int {
		if c := cmpFloat(b.w, a.w); c != 0 {
			return c
		}
		return int(a.id) - int(b.id)
	})
	return s
}

func TestByWeightFindsTheCrossingOfTheSortedOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, kind := range []string{"spread", "ties", "zeros"} {
		for _, n := range []int{1, 3, 33, 500, 20000} {
			cs := randomCands(r, n, kind)
			sorted := sortedByWeight(cs)
			sc := getScratch(0)
			var q byWeight
			q.init(cs, sc)
			var before float64
			for j, c := range sorted {
				if c.w == 0 || (j%97 != 0 && j > 50) {
					before += float64(c.w)
					continue
				}
				// Aim at the middle of the candidate's share, where
				// rounding of the sums cannot move the answer.
				for _, strict := range []bool{false, true} {
					got, gotBefore, ok := q.at(before+float64(c.w)/2, strict)
					if !ok || got != c || math.Abs(gotBefore-before) > 1e-9*before {
						t.Fatalf("%s n=%d: at(middle of #%d %+v) = %+v, %v, %v; want before %v",
							kind, n, j, c, got, gotBefore, ok, before)
					}
				}
				before += float64(c.w)
			}
			if _, _, ok := q.at(before*1.001+1e-9, false); ok {
				t.Errorf("%s n=%d: found a crossing past the total weight", kind, n)
			}
			if total := q.total(); math.Abs(total-before) > 1e-9*before {
				t.Errorf("%s n=%d: total %v, want %v", kind, n, total, before)
			}
			q.release()
			if slices.ContainsFunc(sc.mass, func(m float64) bool { return m != 0 }) {
				t.Fatalf("%s n=%d: release left sums behind", kind, n)
			}
			putScratch(sc)
		}
	}
}

func TestNucleusMatchesASortedWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for _, kind := range []string{"spread", "ties", "zeros"} {
		for _, n := range []int{1, 40, 3000} {
			cs := randomCands(r, n, kind)
			sorted := sortedByWeight(cs)
			var total float64
			for _, c := range cs {
				total += float64(c.w)
			}
			for _, p := range []float64{0.01, 0.5, 0.9, 0.999} {
				// The reference: keep while the weight before is below
				// target. Targets between two running sums avoid
				// rounding ties.
				var want []int32
				var acc float64
				target := p * total
				for _, c := range sorted {
					if acc >= target {
						break
					}
					want = append(want, c.id)
					acc += float64(c.w)
				}
				got := slices.Clone(cs)
				k := nucleus(got, target)
				ids := make([]int32, k)
				for i, c := range got[:k] {
					ids[i] = c.id
				}
				slices.Sort(ids)
				slices.Sort(want)
				if diff := cmp.Diff(want, ids, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s n=%d p=%v: kept (-want +got):\n%s", kind, n, p, diff)
				}
			}
		}
	}
}

func TestDrawNucleusIsAnInverseCDFOverTheNucleus(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	for _, kind := range []string{"spread", "ties"} {
		for _, n := range []int{5, 300, 3000} {
			cs := randomCands(r, n, kind)
			var total float64
			for _, c := range cs {
				total += float64(c.w)
			}
			for _, p := range []float64{0.3, 0.9} {
				kept := slices.Clone(cs)
				kept = kept[:nucleus(kept, p*total)]
				weights := map[int32]float64{}
				for _, c := range kept {
					weights[c.id] = float64(c.w)
				}
				sc := getScratch(0)
				const grid = 5000
				counts := gridCounts(grid, func(u float64) int32 {
					return drawNucleus(cs, p*total, u, sc)
				})
				putScratch(sc)
				checkInverseCDF(t, counts, weights, grid)
			}
		}
	}
}

func TestCollectorsAgreeWithASimpleFilter(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	for _, n := range []int{0, 5, 8, 1001, 5000} {
		w := make([]float32, n)
		for i := range w {
			if r.IntN(5) > 0 {
				w[i] = float32(math.Exp(r.NormFloat64() * 3))
			}
		}
		for _, floor := range []float32{0, 0.01, 1, 30} {
			var want []cand
			for i, v := range w {
				if v > floor {
					want = append(want, cand{w: v, id: int32(i)})
				}
			}
			opt := cmp.AllowUnexported(cand{})
			if diff := cmp.Diff(want, collectSparse(nil, w, floor), opt, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("n=%d floor=%v: collectSparse (-want +got):\n%s", n, floor, diff)
			}
			if diff := cmp.Diff(want, collectDense(nil, w, floor), opt, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("n=%d floor=%v: collectDense (-want +got):\n%s", n, floor, diff)
			}
			for _, minP := range []float32{0.001, 0.3} {
				var wmax float32
				for _, v := range w {
					wmax = max(wmax, v)
				}
				var wantP []cand
				for _, c := range want {
					if c.w >= minP*wmax {
						wantP = append(wantP, c)
					}
				}
				got, gotMax := collectMinP(nil, w, floor, minP)
				if diff := cmp.Diff(wantP, got, opt, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("n=%d floor=%v minP=%v: collectMinP (-want +got):\n%s", n, floor, minP, diff)
				}
				if wmax > floor && gotMax != wmax {
					t.Errorf("n=%d floor=%v minP=%v: largest weight %v, want %v", n, floor, minP, gotMax, wmax)
				}
			}
		}
	}
}

// TestTopPIsExactWhenTheFloorEstimateFails feeds logits whose sampled
// positions (every stride-th) are well above the rest, so the sample sees
// almost no light tail and puts the floor inside the nucleus; the check
// that the tokens above the floor weigh p·z must catch it.
func TestTopPIsExactWhenTheFloorEstimateFails(t *testing.T) {
	const n = 20000
	x := randomLogits(14, n, 1)
	stride := n / floorSamples
	for i := 0; i < n; i += stride {
		x[i] += 3
	}
	p := Params{Temperature: 1, TopP: 0.9}
	s := NewSampler(&p, n, nil)

	sc := getScratch(n)
	r := s.weights(x, sc)
	floor, _ := nucleusFloor(r.w[:n], r.total, float64(p.TopP), sc)
	above, _ := collect(nil, r.w[:n], floor, 0, false)
	if outweighs(above, float64(p.TopP)*r.total) {
		t.Fatalf("the floor estimate did not fail; the test no longer exercises the fallback")
	}
	putScratch(sc)

	got := keptSet(s, x)
	want := refKept(x, p.Temperature, p.TopK, p.TopP, p.MinP)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kept set (-reference +sampler):\n%s", diff)
	}
}

// TestNucleusFloorIsTightAndRarelyTooHigh sweeps flat and peaked logits,
// temperatures and top_p values over a full vocabulary and checks how the
// floor estimate performs: it must almost never be above the nucleus
// (which costs a second collecting pass), and it should not let through
// many more tokens than the nucleus holds.
func TestNucleusFloorIsTightAndRarelyTooHigh(t *testing.T) {
	misses, cases := 0, 0
	var ratio float64
	large := 0
	for seed := range uint64(30) {
		for _, scale := range []float64{1, 2.5, 4} {
			x := randomLogits(seed, 49152, scale)
			if seed%3 == 0 { // a few dominant tokens
				for i := range 5 {
					x[int(seed)*97+i*1000] += float32(8 + i)
				}
			}
			for _, tc := range []struct{ temp, p float32 }{{0.8, 0.9}, {1, 0.95}, {0.7, 0.5}, {1.2, 0.99}} {
				s := NewSampler(&Params{Temperature: tc.temp, TopP: tc.p}, len(x), nil)
				sc := getScratch(len(x))
				r := s.weights(x, sc)
				w := r.w[:len(x)]
				p := float64(tc.p)
				safe := float32((1 - p) * r.total / float64(len(w)))
				floor, _ := nucleusFloor(w, r.total, p, sc)
				cs, _ := collect(nil, w, max(safe, floor), 0, false)
				cases++
				if floor > safe && !outweighs(cs, p*r.total) {
					misses++
				} else if n := nucleus(slices.Clone(cs), p*r.total); n > 500 {
					ratio += float64(len(cs)) / float64(n)
					large++
				}
				putScratch(sc)
			}
		}
	}
	t.Logf("%d of %d floors too high; %.2f candidates per nucleus token in the %d large nuclei",
		misses, cases, ratio/float64(large), large)
	if misses > cases/100 {
		t.Errorf("%d of %d floors were above the nucleus", misses, cases)
	}
	if ratio/float64(large) > 1.5 {
		t.Errorf("%.2f candidates per nucleus token, want at most 1.5", ratio/float64(large))
	}
}
