package sample

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// GreedyTemperature is the temperature below which sampling is greedy
// (argmax), matching vLLM's _SAMPLING_EPS.
const GreedyTemperature = 1e-5

// pcgStream is the fixed second PCG word; the seed is the first. Any constant
// works; fixing it keeps seeded streams stable across releases.
const pcgStream = 0x9e3779b97f4a7c15

var negInf = float32(math.Inf(-1))

type biasEntry struct {
	id   int32
	bias float32
}

// Sampler samples the tokens of one request. It is not safe for concurrent
// use; the engine calls it from its step loop only.
type Sampler struct {
	greedy      bool
	temperature float32
	topK        int
	topP        float32
	minP        float32

	repetition float32 // 1 when off
	presence   float32
	frequency  float32
	penalties  bool

	bias      []biasEntry // sorted by token id
	minTokens int
	stopIDs   []int32 // EOS (unless ignore_eos) and stop_token_ids, masked before min_tokens
	logprobs  int

	rng *rand.Rand

	// promptSet is the sorted set of distinct prompt tokens, built on the
	// first call that needs it (repetition penalty), for promptLen tokens.
	promptSet   []int32
	promptLen   int
	promptBuilt bool
}

// NewSampler returns a Sampler for one request with parameters p (nil means
// the zero Params: greedy, chosen-token logprobs), a model vocabulary of vocab
// ids and the model's end-of-sequence ids. p is copied: later changes to it or
// to its maps and slices do not affect the Sampler. The random stream is
// seeded from p.Seed when p.HasSeed, otherwise from a random seed.
func NewSampler(p *Params, vocab int, eos []int32) *Sampler {
	var q Params
	if p != nil {
		q = *p
	}
	s := &Sampler{
		greedy:      !(q.Temperature >= GreedyTemperature), // NaN counts as greedy
		temperature: q.Temperature,
		topK:        q.TopK,
		topP:        q.TopP,
		minP:        q.MinP,
		repetition:  q.RepetitionPenalty,
		presence:    q.PresencePenalty,
		frequency:   q.FrequencyPenalty,
		minTokens:   q.MinTokens,
		logprobs:    q.Logprobs,
	}
	if !(s.repetition > 0) || math.IsInf(float64(s.repetition), 0) {
		s.repetition = 1
	}
	s.penalties = s.repetition != 1 || s.presence != 0 || s.frequency != 0
	if s.topK < 0 || (vocab > 0 && s.topK >= vocab) {
		s.topK = 0
	}
	if !(s.topP > 0 && s.topP < 1) {
		s.topP = 0
	}
	if !(s.minP > 0 && s.minP <= 1) {
		s.minP = 0
	}
	if s.logprobs < -1 {
		s.logprobs = -1
	}
	for id, b := range q.LogitBias {
		if id >= 0 && (vocab <= 0 || int(id) < vocab) && b != 0 {
			s.bias = append(s.bias, biasEntry{id, b})
		}
	}
	slices.SortFunc(s.bias, func(a, b biasEntry) int { return int(a.id) - int(b.id) })
	if s.minTokens > 0 {
		if !q.IgnoreEOS {
			s.stopIDs = append(s.stopIDs, eos...)
		}
		s.stopIDs = append(s.stopIDs, q.StopTokenIDs...)
		slices.Sort(s.stopIDs)
		s.stopIDs = slices.Compact(s.stopIDs)
	}
	seed := q.Seed
	if !q.HasSeed {
		seed = rand.Uint64()
	}
	s.rng = rand.New(rand.NewPCG(seed, pcgStream))
	return s
}

// Sample returns the next token for a request given the model's logits for
// its last position, the request's prompt and its output so far, and the
// token's logprobs (nil when Params.Logprobs < 0).
//
// logits is only read. Its length is the vocabulary for this call; ids out of
// its range in the parameters, prompt or output are ignored. NaN logits are
// treated as -Inf. prompt must be the same for every call on one Sampler. With
// empty logits Sample returns -1 and nil.
func (s *Sampler) Sample(logits []float32, prompt, output []int32) (int32, *Logprob) {
	u := s.rng.Float64() // exactly one draw per call, used or not
	n := len(logits)
	if n == 0 {
		return -1, nil
	}
	masking := len(output) < s.minTokens && len(s.stopIDs) > 0
	processed := len(s.bias) > 0 || masking || s.penalties
	if s.greedy && !processed && s.logprobs < 0 {
		return argmax(logits), nil // the common case needs no copy
	}
	sc := getScratch(n)
	defer putScratch(sc)

	// Logprobs are of the raw distribution, so take what they need from
	// the logits before any processing. Greedy sampling of unprocessed
	// logits takes its token from the same search.
	var raw rawLogprobs
	if s.logprobs >= 0 {
		top := s.logprobs
		if s.greedy && !processed {
			top = max(top, 1)
		}
		raw = rawLogprobsOf(logits, top, sc)
		sc.rawFits = !processed
	}
	x := logits
	if processed {
		x = resize(sc.x, n)
		sc.x = x
		copy(x, logits)
		for _, b := range s.bias {
			if int(b.id) < n {
				x[b.id] += b.bias
			}
		}
		if masking {
			for _, id := range s.stopIDs {
				if id >= 0 && int(id) < n {
					x[id] = negInf
				}
			}
		}
		if s.penalties {
			s.applyPenalties(x, prompt, output, sc)
		}
	}

	var tok int32
	switch {
	case s.greedy && !processed:
		tok = raw.top[0].id
	case s.greedy:
		tok = argmax(x)
	default:
		tok = s.sampleRandom(x, u, sc)
	}
	if s.logprobs < 0 {
		return tok, nil
	}
	return tok, raw.logprob(tok, logits[tok], s.logprobs)
}

// applyPenalties applies the repetition penalty to every token seen in the
// prompt or output (HF/vLLM: positive logits divided, others multiplied) and
// then the frequency and presence penalties for output tokens (OpenAI:
// logit -= frequency*count + presence*[count > 0]).
func (s *Sampler) applyPenalties(x []float32, prompt, output []int32, sc *scratch) {
	n := len(x)
	counts := sc.counts[:n] // all zero between calls
	touched := sc.touched[:0]
	for _, t := range output {
		if t >= 0 && int(t) < n {
			if counts[t] == 0 {
				touched = append(touched, t)
			}
			counts[t]++
		}
	}
	if s.repetition != 1 {
		if !s.promptBuilt || s.promptLen != len(prompt) {
			s.buildPromptSet(prompt)
		}
		for _, t := range s.promptSet {
			if int(t) < n && counts[t] == 0 {
				x[t] = repetitionPenalty(x[t], s.repetition)
			}
		}
		for _, t := range touched {
			x[t] = repetitionPenalty(x[t], s.repetition)
		}
	}
	for _, t := range touched {
		x[t] -= s.frequency*float32(counts[t]) + s.presence
		counts[t] = 0
	}
	sc.touched = touched
}

func repetitionPenalty(v, penalty float32) float32 {
	if v > 0 {
		return v / penalty
	}
	return v * penalty
}

func (s *Sampler) buildPromptSet(prompt []int32) {
	set := s.promptSet[:0]
	for _, t := range prompt {
		if t >= 0 {
			set = append(set, t)
		}
	}
	slices.Sort(set)
	s.promptSet = slices.Compact(set)
	s.promptLen = len(prompt)
	s.promptBuilt = true
}

// sampleRandom applies temperature, top-k, top-p and min-p to the processed
// logits x and draws a token with the uniform u in [0, 1).
func (s *Sampler) sampleRandom(x []float32, u float64, sc *scratch) int32 {
	if s.topK == 0 && s.topP == 0 {
		return s.sampleDense(x, u, sc)
	}
	cs, z := s.filter(x, sc)
	switch {
	case len(cs) == 0:
		return argmax(x)
	case s.topP > 0:
		return drawNucleus(cs, float64(s.topP)*z, u, sc)
	}
	return draw(cs, u)
}

// weights returns the sampling weights of x at the request's temperature:
// the raw logprobs' exponentials when they are the same numbers.
func (s *Sampler) weights(x []float32, sc *scratch) *expRow {
	if sc.rawFits && s.temperature == 1 {
		return &sc.raw
	}
	sc.row.fill(x, 1/s.temperature)
	return &sc.row
}

// sampleDense draws from temperature and min-p alone, walking the dense
// weights in id order without building a candidate list (except for the
// few tokens min-p keeps); it draws the same token as sampleRandom over
// candidates would.
func (s *Sampler) sampleDense(x []float32, u float64, sc *scratch) int32 {
	r := s.weights(x, sc)
	if !r.ok {
		return argmax(x)
	}
	if s.minP > 0 {
		cs, _ := collect(sc.cands[:0], r.w[:len(r.x)], 0, s.minP, false)
		sc.cands = cs
		return draw(cs, u)
	}
	return drawDense(r.w, u, sc)
}

// candidates returns the tokens that survive temperature, top-k, top-p and
// min-p with their unnormalized probabilities, in no particular order. It
// returns nil when no token has a finite logit or one is +Inf; the caller
// then falls back to argmax. (sampleRandom draws from the top-p nucleus
// without making this list; see drawNucleus.)
func (s *Sampler) candidates(x []float32, sc *scratch) []cand {
	cs, z := s.filter(x, sc)
	if s.topP > 0 && len(cs) > 0 {
		cs = cs[:nucleus(cs, float64(s.topP)*z)]
	}
	return cs
}

// filter returns the tokens that survive temperature, top-k and min-p, and
// with top-p only those that may be in the nucleus, with their
// unnormalized probabilities, and the weight z whose top_p fraction the
// nucleus is cut at. It returns no tokens when no token has a finite logit
// or one is +Inf.
//
// vLLM applies top-p and then min-p. min-p keeps the tokens whose
// probability is at least min_p times the largest; both keep a prefix of
// the tokens in descending order, so filtering min-p first and then cutting
// the nucleus at top_p of the full mass z gives the same set, cheaper.
func (s *Sampler) filter(x []float32, sc *scratch) ([]cand, float64) {
	if s.topK > 0 && s.topK < len(x) {
		return s.topKCandidates(x, sc)
	}
	r := s.weights(x, sc)
	if !r.ok {
		return nil, 0
	}
	return s.weightCandidates(r, sc), r.total
}

// topKCandidates returns the ids at or above the k-th largest logit (ties
// at the k-th value are all kept, as in vLLM) that pass min-p, with their
// weights, and the weight of all k.
func (s *Sampler) topKCandidates(x []float32, sc *scratch) ([]cand, float64) {
	cs := sc.cands[:0]
	k := s.topK
	if k <= heapLimit {
		t := &sc.heap
		t.reset(k)
		t.scan(x, 0)
		if t.tiesDropped() {
			cs = appendAtLeast(cs, x, t.threshold())
		} else {
			for _, e := range t.h {
				if e.v > negInf {
					cs = append(cs, cand{id: e.id})
				}
			}
		}
	} else {
		vals := resize(sc.vals, len(x))
		sc.vals = vals
		for i, v := range x {
			if v != v {
				v = negInf
			}
			vals[i] = v
		}
		cs = appendAtLeast(cs, x, selectDesc(vals, k))
	}
	sc.cands = cs
	m := negInf
	for _, c := range cs {
		m = max(m, x[c.id])
	}
	if len(cs) == 0 || math.IsInf(float64(m), 1) {
		return nil, 0
	}
	invT := 1 / s.temperature
	w := resize(sc.vals, len(cs))
	sc.vals = w
	for j, c := range cs {
		w[j] = x[c.id] * invT // rounded as in expRow
	}
	tensor.ExpSum(w, m*invT)
	var z float64
	for j := range cs {
		cs[j].w = w[j]
		z += float64(w[j])
	}
	if s.minP > 0 {
		// The largest weight is e^0 = 1.
		cs = slices.DeleteFunc(cs, func(c cand) bool { return c.w < s.minP })
	}
	return cs, z
}

// weightCandidates returns the tokens of the dense weights r that pass
// min-p and may be in the top-p nucleus.
func (s *Sampler) weightCandidates(r *expRow, sc *scratch) []cand {
	w := r.w[:len(r.x)]
	if s.topP == 0 {
		cs, _ := collect(sc.cands[:0], w, 0, s.minP, true)
		sc.cands = cs
		return cs
	}
	// A token cannot be in the nucleus if it and all lighter tokens weigh
	// at most (1-p)·z, which holds for every token of weight at most
	// (1-p)·z/V, since at most V tokens weigh no more than it. That bound
	// keeps a large part of a flat vocabulary, so first try a floor
	// estimated from a sample, just below the nucleus's lightest token; it
	// is right if the tokens above it weigh at least p·z (and then every
	// lighter token is out).
	p := float64(s.topP)
	safe := float32((1 - p) * r.total / float64(len(w)))
	floor, expect := nucleusFloor(w, r.total, p, sc)
	dense := expect > len(w)/8
	floor = max(floor, safe)
	cs, wmax := collect(sc.cands[:0], w, floor, s.minP, dense)
	if floor > safe && floor >= s.minP*wmax && !outweighs(cs, p*r.total) {
		cs, _ = collect(cs[:0], w, safe, s.minP, true)
	}
	sc.cands = cs
	return cs
}
