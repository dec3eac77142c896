package sample

import (
	"math"
	"math/rand/v2"
	"slices"
)

// TopLogprob is one alternative token at a position and its log-probability.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// Logprob is the log-probability of the sampled token under the raw model
// distribution and, when asked for, the most likely alternatives sorted by
// descending log-probability (ties: lower token id first).
type Logprob struct {
	Token   int32
	Logprob float32
	Top     []TopLogprob
}

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
	sc := getScratch(n)
	defer putScratch(sc)

	x := sc.x[:n]
	for i, v := range logits {
		if v != v {
			v = negInf
		}
		x[i] = v
	}
	for _, b := range s.bias {
		if int(b.id) < n {
			x[b.id] += b.bias
		}
	}
	if len(output) < s.minTokens {
		for _, id := range s.stopIDs {
			if id >= 0 && int(id) < n {
				x[id] = negInf
			}
		}
	}
	if s.penalties {
		s.applyPenalties(x, prompt, output, sc)
	}

	var tok int32
	if s.greedy {
		tok = argmax(x)
	} else {
		tok = s.sampleRandom(x, u, sc)
	}
	if s.logprobs < 0 {
		return tok, nil
	}
	return tok, logprobsOf(logits, tok, s.logprobs, sc)
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
	threshold := negInf
	if s.topK > 0 && s.topK < len(x) {
		threshold = kthLargest(x, s.topK, sc)
	}
	// Candidates are the ids at or above the top-k threshold (ties at the
	// k-th value are all kept, as in vLLM) with a finite or +Inf logit.
	cs := sc.cands[:0]
	m := negInf
	for i, v := range x {
		if v >= threshold && v > negInf {
			cs = append(cs, cand{id: int32(i)})
			if v > m {
				m = v
			}
		}
	}
	sc.cands = cs
	if len(cs) == 0 || math.IsInf(float64(m), 1) {
		return argmax(x)
	}
	invT := 1 / s.temperature
	var z float64
	for j := range cs {
		w := exp32((x[cs[j].id] - m) * invT)
		cs[j].w = w
		z += float64(w)
	}
	// vLLM applies top-p and then min-p. min-p keeps the tokens whose
	// probability is at least min_p times the largest, i.e. weight >= min_p
	// here (the largest weight is exp(0) = 1); both keep a prefix of the
	// tokens in descending order, so filtering min-p first and then cutting
	// the nucleus at top_p of the full mass z gives the same set, cheaper.
	if s.minP > 0 {
		k := 0
		for _, c := range cs {
			if c.w >= s.minP {
				cs[k] = c
				k++
			}
		}
		cs = cs[:k]
	}
	if s.topP > 0 {
		cs = cs[:nucleus(cs, float64(s.topP)*z)]
	}
	var total float64
	for _, c := range cs {
		total += float64(c.w)
	}
	target := u * total
	var acc float64
	for _, c := range cs {
		acc += float64(c.w)
		if acc > target {
			return c.id
		}
	}
	// Rounding left target at or beyond the sum: take the last token with
	// any weight.
	for j := len(cs) - 1; j >= 0; j-- {
		if cs[j].w > 0 {
			return cs[j].id
		}
	}
	return cs[0].id
}

// argmax returns the index of the largest value, the lowest on ties.
func argmax(x []float32) int32 {
	best, bv := 0, x[0]
	for i, v := range x {
		if v > bv {
			best, bv = i, v
		}
	}
	return int32(best)
}

// logprobsOf computes the raw log-softmax of logits at tok and the top
// alternatives.
func logprobsOf(logits []float32, tok int32, top int, sc *scratch) *Logprob {
	m := negInf
	h := sc.heap[:0]
	for i, v := range logits {
		if v != v {
			v = negInf
		}
		if v > m {
			m = v
		}
		if top > 0 {
			h = heapOffer(h, top, entry{v: v, id: int32(i)})
		}
	}
	sc.heap = h
	logp := func(v float32) float32 { return negInf }
	if !math.IsInf(float64(m), 0) {
		var z float64
		for _, v := range logits {
			if v == v {
				z += float64(exp32(v - m))
			}
		}
		lz := math.Log(z)
		logp = func(v float32) float32 {
			if v != v {
				return negInf
			}
			return float32(float64(v-m) - lz)
		}
	} else if m > 0 {
		logp = func(v float32) float32 {
			if v == m {
				return 0
			}
			return negInf
		}
	}
	lp := &Logprob{Token: tok, Logprob: logp(logits[tok])}
	if top > 0 {
		slices.SortFunc(h, func(a, b entry) int {
			if a.better(b) {
				return -1
			}
			return 1
		})
		lp.Top = make([]TopLogprob, len(h))
		for j, e := range h {
			lp.Top[j] = TopLogprob{Token: e.id, Logprob: logp(e.v)}
		}
	}
	return lp
}
