package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// randomLogits returns n logits drawn from N(0, scale²) with a fixed seed.
func randomLogits(seed uint64, n int, scale float64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func seeded(p Params, seed uint64) Params {
	p.Seed, p.HasSeed = seed, true
	return p
}

func TestSampleGreedyTakesArgmaxLowestIDOnTies(t *testing.T) {
	tests := []struct {
		name   string
		temp   float32
		logits []float32
		want   int32
	}{
		{"a single maximum wins", 0, []float32{0.1, 3, -2, 2.9}, 1},
		{"ties go to the lowest id", 0, []float32{1, 5, 5, 5}, 1},
		{"temperature below 1e-5 is greedy", 9e-6, []float32{1, 2, 7, 3}, 2},
		{"NaN never wins", 0, []float32{float32(math.NaN()), 1, 0}, 1},
		{"all -Inf falls back to id 0", 0, []float32{negInf, negInf}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSampler(&Params{Temperature: tc.temp, Logprobs: -1}, len(tc.logits), nil)
			for range 5 {
				if got, _ := s.Sample(tc.logits, nil, nil); got != tc.want {
					t.Fatalf("Sample = %d, want %d", got, tc.want)
				}
			}
		})
	}
}

func TestSampleSameSeedSameTokensDifferentSeedsDiffer(t *testing.T) {
	const vocab, steps = 1000, 64
	logits := randomLogits(7, vocab, 1) // flat enough that draws vary
	run := func(seed uint64) []int32 {
		s := NewSampler(&Params{Temperature: 1, Seed: seed, HasSeed: true, Logprobs: -1}, vocab, nil)
		var out []int32
		for range steps {
			tok, _ := s.Sample(logits, nil, out)
			out = append(out, tok)
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed gave different tokens (-first +second):\n%s", diff)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 42 and 43 gave the same %d tokens", steps)
	}
}

// TestSampleConsumesOneDrawPerCall pins the batch-invariance contract: after k
// calls the stream is exactly k Float64 draws in, whatever the parameters.
func TestSampleConsumesOneDrawPerCall(t *testing.T) {
	logits := randomLogits(1, 300, 2)
	tests := []struct {
		name   string
		p      Params
		logits []float32
	}{
		{"greedy", Params{}, logits},
		{"temperature", Params{Temperature: 0.8}, logits},
		{"top-k, top-p, min-p and penalties", Params{Temperature: 1, TopK: 20, TopP: 0.9, MinP: 0.01, RepetitionPenalty: 1.2, PresencePenalty: 0.5, Logprobs: 5}, logits},
		{"empty logits", Params{Temperature: 1}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const calls = 7
			s := NewSampler(new(seeded(tc.p, 99)), 300, []int32{2})
			for range calls {
				s.Sample(tc.logits, []int32{1, 2, 3}, []int32{4, 4})
			}
			ref := rand.New(rand.NewPCG(99, pcgStream))
			for range calls {
				ref.Float64()
			}
			if got, want := s.rng.Uint64(), ref.Uint64(); got != want {
				t.Errorf("after %d calls the stream is not %d draws in", calls, calls)
			}
		})
	}
}

func TestSampleTopK1AndTinyTopPAreGreedy(t *testing.T) {
	tests := []struct {
		name string
		p    Params
	}{
		{"top_k=1", Params{Temperature: 1.5, TopK: 1}},
		{"top_p=1e-6", Params{Temperature: 1.5, TopP: 1e-6}},
		{"min_p=1", Params{Temperature: 1.5, MinP: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(20) {
				logits := randomLogits(seed, 5000, 3)
				s := NewSampler(new(seeded(tc.p, seed)), len(logits), nil)
				for range 5 {
					if got, want := mustSample(t, s, logits), argmax(logits); got != want {
						t.Fatalf("seed %d: Sample = %d, greedy = %d", seed, got, want)
					}
				}
			}
		})
	}
}

func mustSample(t *testing.T, s *Sampler, logits []float32) int32 {
	t.Helper()
	tok, _ := s.Sample(logits, nil, nil)
	return tok
}

// refKept is a straightforward full-sort implementation of vLLM's filters,
// applied in order top-k, top-p, min-p. Weights use exp32 like the sampler so
// the comparison tests selection, not rounding.
func refKept(x []float32, temp float32, topK int, topP, minP float32) []int32 {
	ids := make([]int32, len(x))
	for i := range ids {
		ids[i] = int32(i)
	}
	slices.SortStableFunc(ids, func(a, b int32) int {
		switch {
		case x[a] > x[b]:
			return -1
		case x[a] < x[b]:
			return 1
		}
		return 0
	})
	if topK > 0 && topK < len(x) {
		thr := x[ids[topK-1]]
		k := 0
		for k < len(ids) && x[ids[k]] >= thr {
			k++
		}
		ids = ids[:k]
	}
	m := x[ids[0]]
	w := make([]float32, len(ids))
	var z float64
	for j, id := range ids {
		w[j] = exp32((x[id] - m) * (1 / temp))
		z += float64(w[j])
	}
	keep := len(ids)
	if topP > 0 && topP < 1 {
		var acc float64
		for j := range ids {
			if acc >= float64(topP)*z {
				keep = j
				break
			}
			acc += float64(w[j])
		}
	}
	ids = ids[:keep]
	if minP > 0 {
		k := 0
		for k < len(ids) && w[k] >= minP*w[0] {
			k++
		}
		ids = ids[:k]
	}
	slices.Sort(ids)
	return ids
}

func keptSet(s *Sampler, x []float32) []int32 {
	sc := getScratch(len(x))
	defer putScratch(sc)
	var ids []int32
	for _, c := range s.candidates(x, sc) {
		ids = append(ids, c.id)
	}
	slices.Sort(ids)
	return ids
}

func TestCandidatesMatchFullSortReference(t *testing.T) {
	tied := make([]float32, 3000)
	for i := range tied {
		tied[i] = float32(i % 7) // many exact ties
	}
	inputs := []struct {
		name   string
		logits []float32
	}{
		{"peaked random logits", randomLogits(3, 49152, 4)},
		{"flat random logits", randomLogits(4, 20000, 0.5)},
		{"many exact ties", tied},
		{"ascending logits", func() []float32 {
			x := make([]float32, 4000)
			for i := range x {
				x[i] = float32(i) / 400
			}
			return x
		}()},
	}
	params := []Params{
		{Temperature: 1, TopP: 0.9},
		{Temperature: 0.7, TopP: 0.5},
		{Temperature: 1.3, TopP: 0.99},
		{Temperature: 1, TopK: 50},
		{Temperature: 1, TopK: 1000}, // the quickselect path
		{Temperature: 1, TopK: 50, TopP: 0.8},
		{Temperature: 1, TopK: 2000, TopP: 0.95},
		{Temperature: 1, MinP: 0.1},
		{Temperature: 0.5, TopP: 0.9, MinP: 0.05},
		{Temperature: 1, TopK: 300, TopP: 0.6, MinP: 0.2},
	}
	for _, in := range inputs {
		for _, p := range params {
			name := in.name
			t.Run(name, func(t *testing.T) {
				s := NewSampler(&p, len(in.logits), nil)
				got := keptSet(s, in.logits)
				want := refKept(in.logits, p.Temperature, p.TopK, p.TopP, p.MinP)
				if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("params %+v: kept set differs (-reference +sampler):\n%s", p, diff)
				}
			})
		}
	}
}

func TestSampleMinPFiltersBelowFractionOfMax(t *testing.T) {
	// Probabilities proportional to 8, 4, 2, 1: min_p=0.25 keeps weights >=
	// 2 (ids 0, 1, 2) and min_p=0.5 keeps ids 0 and 1.
	logits := []float32{float32(math.Log(8)), float32(math.Log(4)), float32(math.Log(2)), 0}
	tests := []struct {
		minP float32
		want []int32
	}{
		{0, []int32{0, 1, 2, 3}},
		{0.25, []int32{0, 1, 2}},
		{0.5, []int32{0, 1}},
		{0.51, []int32{0}},
		{1, []int32{0}},
	}
	for _, tc := range tests {
		s := NewSampler(&Params{Temperature: 1, MinP: tc.minP}, 4, nil)
		if diff := cmp.Diff(tc.want, keptSet(s, logits)); diff != "" {
			t.Errorf("min_p=%v kept (-want +got):\n%s", tc.minP, diff)
		}
		seen := map[int32]bool{}
		for range 400 {
			seen[mustSample(t, s, logits)] = true
		}
		for tok := range seen {
			if !slices.Contains(tc.want, tok) {
				t.Errorf("min_p=%v sampled filtered token %d", tc.minP, tok)
			}
		}
	}
}

func TestSampleFrequenciesFollowSoftmax(t *testing.T) {
	logits := []float32{2, 1, 0, -1, 0.5}
	tests := []struct {
		name string
		p    Params
	}{
		{"temperature 1", Params{Temperature: 1}},
		{"temperature 0.5", Params{Temperature: 0.5}},
		{"top_p 0.8 renormalizes the nucleus", Params{Temperature: 1, TopP: 0.8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]float64, len(logits))
			for _, id := range refKept(logits, tc.p.Temperature, 0, tc.p.TopP, 0) {
				want[id] = math.Exp(float64(logits[id]) / float64(tc.p.Temperature))
			}
			var z float64
			for _, w := range want {
				z += w
			}
			const draws = 40000
			s := NewSampler(new(seeded(tc.p, 5)), len(logits), nil)
			got := make([]float64, len(logits))
			for range draws {
				got[mustSample(t, s, logits)]++
			}
			for i := range got {
				// 5 standard deviations of a binomial proportion.
				p := want[i] / z
				tol := 5*math.Sqrt(p*(1-p)/draws) + 1e-9
				if math.Abs(got[i]/draws-p) > tol {
					t.Errorf("token %d: frequency %.4f, want %.4f ± %.4f", i, got[i]/draws, p, tol)
				}
			}
		})
	}
}

func TestPenaltiesMatchHandComputedLogits(t *testing.T) {
	// Prompt {0, 1}, output {1, 2, 2}: counts 1→1, 2→2.
	prompt, output := []int32{0, 1}, []int32{1, 2, 2}
	logits := []float32{2, -2, 4, 1}
	tests := []struct {
		name string
		p    Params
		want []float32
	}{
		{"repetition divides positive and multiplies negative logits of prompt and output tokens",
			Params{RepetitionPenalty: 2}, []float32{1, -4, 2, 1}},
		{"repetition below 1 boosts",
			Params{RepetitionPenalty: 0.5}, []float32{4, -1, 8, 1}},
		{"presence subtracts once per output token",
			Params{PresencePenalty: 0.5}, []float32{2, -2.5, 3.5, 1}},
		{"frequency subtracts per occurrence",
			Params{FrequencyPenalty: 0.25}, []float32{2, -2.25, 3.5, 1}},
		{"negative frequency encourages",
			Params{FrequencyPenalty: -1}, []float32{2, -1, 6, 1}},
		{"repetition then frequency and presence",
			Params{RepetitionPenalty: 2, PresencePenalty: 1, FrequencyPenalty: 0.5}, []float32{1, -5.5, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSampler(&tc.p, len(logits), nil)
			sc := getScratch(len(logits))
			defer putScratch(sc)
			x := slices.Clone(logits)
			s.applyPenalties(x, prompt, output, sc)
			if diff := cmp.Diff(tc.want, x); diff != "" {
				t.Errorf("logits after penalties (-want +got):\n%s", diff)
			}
			if slices.ContainsFunc(sc.counts[:len(logits)], func(c int32) bool { return c != 0 }) {
				t.Errorf("counts scratch not cleared: %v", sc.counts[:len(logits)])
			}
		})
	}
}

func TestSamplePenaltiesChangeGreedyChoice(t *testing.T) {
	logits := []float32{3, 2.5, 0}
	s := NewSampler(&Params{FrequencyPenalty: 1}, 3, nil)
	if got, _ := s.Sample(logits, nil, []int32{0}); got != 1 {
		t.Errorf("after token 0 once with frequency_penalty 1: got %d, want 1", got)
	}
	s = NewSampler(&Params{RepetitionPenalty: 1.5}, 3, nil)
	if got, _ := s.Sample(logits, []int32{0, 0, 7, -1}, nil); got != 1 {
		t.Errorf("prompt token 0 with repetition_penalty 1.5 (3/1.5 < 2.5): got %d, want 1", got)
	}
}

func TestSampleLogitBiasForcesAndBlocks(t *testing.T) {
	logits := randomLogits(11, 500, 2)
	top := argmax(logits)
	tests := []struct {
		name  string
		p     Params
		check func(tok int32) bool
	}{
		{"+100 forces a token under temperature", Params{Temperature: 1, LogitBias: map[int32]float32{321: 100}},
			func(tok int32) bool { return tok == 321 }},
		{"-100 blocks the greedy token", Params{LogitBias: map[int32]float32{top: -100}},
			func(tok int32) bool { return tok != top }},
		{"out-of-vocabulary keys are ignored", Params{LogitBias: map[int32]float32{9999: 100, -3: 100}},
			func(tok int32) bool { return tok == top }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSampler(new(seeded(tc.p, 3)), len(logits), nil)
			for range 50 {
				if tok := mustSample(t, s, logits); !tc.check(tok) {
					t.Fatalf("sampled %d", tok)
				}
			}
		})
	}
}

func TestSampleMinTokensMasksStopTokens(t *testing.T) {
	const eos, stopID = 2, 3
	logits := []float32{0, 1, 10, 9, 8} // EOS, then stop id, then 4 lead
	tests := []struct {
		name   string
		p      Params
		outLen int
		want   int32
	}{
		{"EOS is masked before min_tokens", Params{MinTokens: 3, StopTokenIDs: []int32{stopID}}, 2, 4},
		{"EOS is allowed at min_tokens", Params{MinTokens: 3, StopTokenIDs: []int32{stopID}}, 3, eos},
		{"without stop ids the next stop token wins", Params{MinTokens: 3}, 0, stopID},
		{"ignore_eos leaves EOS to the caller", Params{MinTokens: 3, IgnoreEOS: true}, 0, eos},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSampler(&tc.p, len(logits), []int32{eos})
			if got, _ := s.Sample(logits, nil, make([]int32, tc.outLen)); got != tc.want {
				t.Errorf("Sample = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSampleLogprobsAreRawLogSoftmax(t *testing.T) {
	logits := randomLogits(21, 3000, 3)
	logits[17] = float32(math.NaN())
	orig := slices.Clone(logits)
	var m float64 = math.Inf(-1)
	for _, v := range logits {
		if !math.IsNaN(float64(v)) {
			m = max(m, float64(v))
		}
	}
	var z float64
	for _, v := range logits {
		if !math.IsNaN(float64(v)) {
			z += math.Exp(float64(v) - m)
		}
	}
	ref := func(id int32) float64 { return float64(logits[id]) - m - math.Log(z) }

	for _, n := range []int{0, 1, 5, 20} {
		// Processing (bias, temperature, top-k) must not change logprobs.
		p := seeded(Params{Temperature: 0.3, TopK: 10, LogitBias: map[int32]float32{5: 50}, Logprobs: n}, 8)
		s := NewSampler(&p, len(logits), nil)
		tok, lp := s.Sample(logits, nil, nil)
		if lp == nil || lp.Token != tok {
			t.Fatalf("logprobs=%d: got %+v for token %d", n, lp, tok)
		}
		if math.Abs(float64(lp.Logprob)-ref(tok)) > 1e-4 {
			t.Errorf("logprobs=%d: chosen logprob %v, want %v", n, lp.Logprob, ref(tok))
		}
		if len(lp.Top) != n {
			t.Fatalf("logprobs=%d: %d alternatives", n, len(lp.Top))
		}
		ids := make([]int32, len(logits))
		for i := range ids {
			ids[i] = int32(i)
		}
		ids = slices.DeleteFunc(ids, func(i int32) bool { return i == 17 })
		slices.SortStableFunc(ids, func(a, b int32) int { return -cmpFloat(logits[a], logits[b]) })
		for j, e := range lp.Top {
			if e.Token != ids[j] || math.Abs(float64(e.Logprob)-ref(e.Token)) > 1e-4 {
				t.Errorf("logprobs=%d: top[%d] = %+v, want token %d logprob %v", n, j, e, ids[j], ref(ids[j]))
			}
			if j > 0 && lp.Top[j-1].Logprob < e.Logprob {
				t.Errorf("logprobs=%d: top list not descending at %d", n, j)
			}
		}
	}
	if !slices.EqualFunc(orig, logits, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
		t.Error("Sample modified the caller's logits")
	}
	s := NewSampler(&Params{Logprobs: -1}, len(logits), nil)
	if _, lp := s.Sample(logits, nil, nil); lp != nil {
		t.Errorf("logprobs=-1 returned %+v", lp)
	}
}

func cmpFloat(a, b float32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestSampleLogprobTopBreaksTiesByID(t *testing.T) {
	s := NewSampler(&Params{Logprobs: 3}, 5, nil)
	_, lp := s.Sample([]float32{1, 3, 3, 0, 3}, nil, nil)
	var got []int32
	for _, e := range lp.Top {
		got = append(got, e.Token)
	}
	if diff := cmp.Diff([]int32{1, 2, 4}, got); diff != "" {
		t.Errorf("top tokens (-want +got):\n%s", diff)
	}
}

func TestSampleEmptyLogitsReturnsMinusOne(t *testing.T) {
	s := NewSampler(nil, 0, nil)
	if tok, lp := s.Sample(nil, nil, nil); tok != -1 || lp != nil {
		t.Errorf("Sample(nil) = %d, %+v; want -1, nil", tok, lp)
	}
}

func TestExp32MatchesMathExp(t *testing.T) {
	for x := float32(-87); x <= 88; x += 0.0137 {
		got, want := float64(exp32(x)), math.Exp(float64(x))
		if rel := math.Abs(got-want) / want; rel > 4e-7 {
			t.Fatalf("exp32(%v) = %v, want %v (relative error %.2g)", x, got, want, rel)
		}
	}
	for _, tc := range []struct{ x, want float32 }{{0, 1}, {negInf, 0}, {-100, 0}, {float32(math.Inf(1)), float32(math.Inf(1))}} {
		if got := exp32(tc.x); got != tc.want {
			t.Errorf("exp32(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}

func TestSelectDescMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for trial := range 200 {
		n := 1 + r.IntN(2000)
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.IntN(1 + trial)) // from all-equal to mostly distinct
		}
		sorted := slices.Clone(v)
		slices.SortFunc(sorted, func(a, b float32) int { return -cmpFloat(a, b) })
		k := 1 + r.IntN(n)
		if got := selectDesc(v, k); got != sorted[k-1] {
			t.Fatalf("trial %d: %d-th largest of %d = %v, want %v", trial, k, n, got, sorted[k-1])
		}
	}
}

func TestNucleusCutsWhereMassBeforeReachesTarget(t *testing.T) {
	many := func(n int, w float32) []float32 { return slices.Repeat([]float32{w}, n) }
	tests := []struct {
		name    string
		weights []float32 // token i has weight weights[i]
		target  float64
		want    []int32
	}{
		{"a token whose preceding mass equals the target is dropped", []float32{1, 2, 4, 1}, 4, []int32{2}},
		{"the token that crosses the target is kept", []float32{1, 2, 4, 1}, 4.5, []int32{1, 2}},
		{"at least one token is kept", []float32{1, 2, 4, 1}, 1e-9, []int32{2}},
		{"everything is kept when the target is the total", []float32{1, 2, 4, 1}, 8, []int32{0, 1, 2, 3}},
		{"equal weights are taken in id order", []float32{1, 1, 1, 1}, 2, []int32{0, 1}},
		{"equal weights in the partitioned path", many(40, 1), 10, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"a tie group straddling the cut in the partitioned path",
			append(many(30, 1), many(30, 2)...), 64, append([]int32{0, 1, 2, 3}, seq(30, 60)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Shuffle deterministically so the input order is not the answer.
			r := rand.New(rand.NewPCG(1, 1))
			cs := make([]cand, len(tc.weights))
			for i, w := range tc.weights {
				cs[i] = cand{w: w, id: int32(i)}
			}
			r.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
			n := nucleus(cs, tc.target)
			var got []int32
			for _, c := range cs[:n] {
				got = append(got, c.id)
			}
			slices.Sort(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
		})
	}
}

func seq(from, to int32) []int32 {
	var s []int32
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestExpSumMatchesExp32(t *testing.T) {
	src := append(randomLogits(9, 1000, 30), negInf, 0, -200, 200)
	const m, scale = 3, 0.7
	dst := make([]float32, len(src))
	sum := expSum(dst, src, m, scale)
	var want float64
	for i, v := range src {
		e := exp32((v - m) * scale)
		if math.Float32bits(dst[i]) != math.Float32bits(e) {
			t.Fatalf("expSum[%d] = %v, exp32 = %v", i, dst[i], e)
		}
		want += float64(e)
	}
	if sum != want {
		t.Errorf("sum = %v, want %v", sum, want)
	}
}

func TestSampleDenseDrawsLikeCandidates(t *testing.T) {
	x := randomLogits(13, 5000, 2)
	for _, p := range []Params{{Temperature: 1}, {Temperature: 0.6, MinP: 0.02}, {Temperature: 2, MinP: 0.5}} {
		s := NewSampler(&p, len(x), nil)
		sc := getScratch(len(x))
		for i := range 200 {
			u := float64(i) / 200
			want := draw(s.candidates(x, sc), u)
			if got := s.sampleDense(x, u, sc); got != want {
				t.Fatalf("params %+v, u=%v: dense drew %d, candidates %d", p, u, got, want)
			}
		}
		putScratch(sc)
	}
}

// TestLogprobsDoNotChangeTheTokens guards the reuse of the logprobs pass's
// weights for sampling at temperature 1: asking for logprobs must not change
// which tokens are drawn.
func TestLogprobsDoNotChangeTheTokens(t *testing.T) {
	logits := randomLogits(17, 4000, 1.5)
	tests := []Params{
		{Temperature: 1},
		{Temperature: 1, TopP: 0.7},
		{Temperature: 1, MinP: 0.1},
		{Temperature: 1, TopK: 30},
		{Temperature: 1, LogitBias: map[int32]float32{7: 3}},
		{Temperature: 1, PresencePenalty: 1.5},
		{Temperature: 0.7},
	}
	for _, p := range tests {
		run := func(logprobs int) []int32 {
			q := seeded(p, 77)
			q.Logprobs = logprobs
			s := NewSampler(&q, len(logits), nil)
			var out []int32
			for range 30 {
				tok, _ := s.Sample(logits, nil, out)
				out = append(out, tok)
			}
			return out
		}
		if diff := cmp.Diff(run(-1), run(3)); diff != "" {
			t.Errorf("params %+v: tokens differ with logprobs (-without +with):\n%s", p, diff)
		}
	}
}

// TestDistinctSamplersRunConcurrently backs the package doc's promise that
// distinct Samplers share no mutable state (run it with -race).
func TestDistinctSamplersRunConcurrently(t *testing.T) {
	logits := randomLogits(5, 3000, 2)
	p := Params{Temperature: 0.9, TopP: 0.9, TopK: 400, PresencePenalty: 0.3, Logprobs: 2}
	run := func(seed uint64) []int32 {
		s := NewSampler(new(seeded(p, seed)), len(logits), nil)
		var out []int32
		for range 40 {
			tok, _ := s.Sample(logits, []int32{1, 2}, out)
			out = append(out, tok)
		}
		return out
	}
	want := make([][]int32, 4)
	for i := range want {
		want[i] = run(uint64(i))
	}
	got := make([][]int32, 4)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = run(uint64(i)) })
	}
	wg.Wait()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("concurrent runs differ from sequential ones (-sequential +concurrent):\n%s", diff)
	}
}
