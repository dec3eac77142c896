package sample

import (
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// samplingParams covers every sampling path: greedy, dense (temperature,
// min-p), top-k, top-p (sparse and dense nuclei), their combinations and
// processed logits, with and without logprobs.
var samplingParams = []Params{
	{},
	{Temperature: 1},
	{Temperature: 0.7},
	{Temperature: 0.8, MinP: 0.05},
	{Temperature: 1, TopK: 40},
	{Temperature: 1, TopK: 600},
	{Temperature: 0.8, TopP: 0.9},
	{Temperature: 1, TopP: 0.97},
	{Temperature: 1.2, TopK: 300, TopP: 0.8, MinP: 0.02},
	{Temperature: 0.9, TopP: 0.9, FrequencyPenalty: 0.5, LogitBias: map[int32]float32{3: 2}},
}

func withLogprobs(p Params, n int) Params {
	p.Logprobs = n
	return p
}

func TestSampleNonFiniteLogits(t *testing.T) {
	const n = 3000
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, p := range samplingParams {
		for _, lp := range []int{-1, 3} {
			q := withLogprobs(p, lp)
			t.Run("+Inf wins", func(t *testing.T) {
				x := randomLogits(2, n, 2)
				x[700], x[2100] = inf, inf
				s := NewSampler(new(seeded(q, 1)), n, nil)
				for range 10 {
					tok, lpr := s.Sample(x, nil, nil)
					if tok != 700 {
						t.Fatalf("params %+v: Sample = %d, want the first +Inf, 700", q, tok)
					}
					if lp >= 0 && (lpr.Logprob != 0 || lpr.Top[0].Token != 700 || lpr.Top[1].Logprob != 0) {
						t.Fatalf("params %+v: logprobs %+v, want 0 for the +Inf tokens", q, lpr)
					}
				}
			})
			t.Run("NaN is never drawn", func(t *testing.T) {
				x := randomLogits(3, n, 0.3) // flat, so every token is likely
				for i := 0; i < n; i += 3 {
					x[i] = nan
				}
				s := NewSampler(new(seeded(q, 2)), n, nil)
				for range 50 {
					tok, lpr := s.Sample(x, nil, nil)
					if tok%3 == 0 {
						t.Fatalf("params %+v: drew NaN token %d", q, tok)
					}
					if lp >= 0 && (math.IsNaN(float64(lpr.Logprob)) || lpr.Top[0].Token%3 == 0) {
						t.Fatalf("params %+v: logprobs %+v", q, lpr)
					}
				}
			})
			t.Run("all -Inf gives token 0", func(t *testing.T) {
				x := slices.Repeat([]float32{negInf}, n)
				s := NewSampler(new(seeded(q, 3)), n, nil)
				if tok, _ := s.Sample(x, nil, nil); tok != 0 {
					t.Fatalf("params %+v: Sample = %d, want 0", q, tok)
				}
			})
		}
	}
}

// TestKeptSetsAtExtremes compares the kept sets with the full-sort
// reference where the sampler's fast paths fall back: a maximum the
// shift estimate misses by far, and a low temperature.
func TestKeptSetsAtExtremes(t *testing.T) {
	const n = 20000
	missed := randomLogits(5, n, 2)
	missed[1], missed[2] = 70, 69.8 // never in the sample for the shift
	inputs := []struct {
		name string
		x    []float32
	}{
		{"a maximum the sample misses", missed},
		{"spread logits", randomLogits(6, n, 4)},
	}
	params := []Params{
		{Temperature: 1, TopP: 0.9},
		{Temperature: 0.05, TopP: 0.9},
		{Temperature: 0.3, TopP: 0.9},
		{Temperature: 0.3, MinP: 0.01},
		{Temperature: 0.3, TopK: 20, TopP: 0.5},
	}
	for _, in := range inputs {
		for _, p := range params {
			s := NewSampler(&p, n, nil)
			got := keptSet(s, in.x)
			want := refKept(in.x, p.Temperature, p.TopK, p.TopP, p.MinP)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s, params %+v: kept set (-reference +sampler):\n%s", in.name, p, diff)
			}
		}
	}
}

// TestSampleDrawsFromTheKeptSet checks end to end that every drawn token is
// in candidates' set, for every path.
func TestSampleDrawsFromTheKeptSet(t *testing.T) {
	x := randomLogits(7, 8000, 2.5)
	for _, p := range samplingParams {
		if p.Temperature == 0 || len(p.LogitBias) > 0 || p.FrequencyPenalty != 0 {
			continue // keptSet sees unprocessed logits
		}
		kept := keptSet(NewSampler(&p, len(x), nil), x)
		for _, lp := range []int{-1, 2} {
			s := NewSampler(new(seeded(withLogprobs(p, lp), 4)), len(x), nil)
			for range 100 {
				if tok, _ := s.Sample(x, nil, nil); !slices.Contains(kept, tok) {
					t.Fatalf("params %+v: drew %d, not in the kept set", p, tok)
				}
			}
		}
	}
}

// TestLogprobsAreAccurateOnAFullVocabulary holds the raw logprobs to 1e-5 of
// a float64 log-softmax on a full-size vocabulary, for every path (they
// never depend on the sampling parameters).
func TestLogprobsAreAccurateOnAFullVocabulary(t *testing.T) {
	for _, scale := range []float64{1, 2.5, 8} {
		x := randomLogits(8, 49152, scale)
		m := math.Inf(-1)
		for _, v := range x {
			m = max(m, float64(v))
		}
		var z float64
		for _, v := range x {
			z += math.Exp(float64(v) - m)
		}
		ref := func(id int32) float64 { return float64(x[id]) - m - math.Log(z) }
		order := make([]int32, len(x))
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortStableFunc(order, func(a, b int32) int { return -cmpFloat(x[a], x[b]) })
		for _, p := range samplingParams {
			s := NewSampler(new(seeded(withLogprobs(p, 20), 5)), len(x), nil)
			tok, lp := s.Sample(x, nil, []int32{1, 2, 3})
			if d := math.Abs(float64(lp.Logprob) - ref(tok)); d > 1e-5 {
				t.Errorf("scale %v, params %+v: chosen logprob off by %.2g", scale, p, d)
			}
			for j, e := range lp.Top {
				if e.Token != order[j] {
					t.Fatalf("scale %v, params %+v: top[%d] is %d, want %d", scale, p, j, e.Token, order[j])
				}
				if d := math.Abs(float64(e.Logprob) - ref(e.Token)); d > 1e-5 {
					t.Errorf("scale %v, params %+v: top[%d] logprob off by %.2g", scale, p, j, d)
				}
			}
		}
	}
}

// TestSampleDoesNotAllocate pins that the per-call buffers are reused: no
// allocation without logprobs, and only the result (the Logprob and its
// alternatives) with them.
func TestSampleDoesNotAllocate(t *testing.T) {
	x := randomLogits(9, 49152, 2.5)
	output := []int32{5, 6, 7}
	for _, p := range samplingParams {
		for _, lp := range []int{-1, 5} {
			s := NewSampler(new(seeded(withLogprobs(p, lp), 6)), len(x), nil)
			want := 0.0
			if lp >= 0 {
				want = 2
			}
			if got := testing.AllocsPerRun(20, func() { s.Sample(x, nil, output) }); got != want {
				t.Errorf("params %+v, logprobs %d: %v allocations per call, want %v", p, lp, got, want)
			}
		}
	}
}

// TestSeededTokensDoNotDependOnOtherCalls interleaves a request with
// others of different vocabularies and parameters, which leave the shared
// per-call buffers in other states: the request's tokens must not change.
func TestSeededTokensDoNotDependOnOtherCalls(t *testing.T) {
	x := randomLogits(10, 6000, 2)
	others := []struct {
		x []float32
		p Params
	}{
		{randomLogits(11, 9000, 3), Params{Temperature: 0.5, TopP: 0.5, Logprobs: 4}},
		{randomLogits(12, 100, 1), Params{Temperature: 2, TopK: 7, MinP: 0.1}},
		{randomLogits(13, 50000, 1), Params{Temperature: 1, PresencePenalty: 1, Logprobs: 0}},
	}
	for _, p := range samplingParams {
		run := func(interleave bool) []int32 {
			s := NewSampler(new(seeded(p, 21)), len(x), nil)
			var out []int32
			for i := range 12 {
				if interleave {
					o := others[i%len(others)]
					NewSampler(&o.p, len(o.x), nil).Sample(o.x, nil, nil)
				}
				tok, _ := s.Sample(x, nil, out)
				out = append(out, tok)
			}
			return out
		}
		if diff := cmp.Diff(run(false), run(true)); diff != "" {
			t.Errorf("params %+v: tokens change with other calls in between (-alone +interleaved):\n%s", p, diff)
		}
	}
}
