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
	masking := len(output) < s.minTokens && len(s.stopIDs) > 0
	processed := len(s.bias) > 0 || masking || s.penalties
	if s.greedy && !processed && s.logprobs < 0 {
		return argmax(logits), nil // the common case needs no copy
	}
	sc := getScratch(n)
	defer putScratch(sc)

	// Copy, treating NaN as -Inf; the raw maximum feeds logprobs and is
	// the greedy token when nothing changes the logits.
	x := sc.x[:n]
	rawMax, rawArg := negInf, 0
	for i, v := range logits {
		if v != v {
			v = negInf
		}
		x[i] = v
		if v > rawMax {
			rawMax, rawArg = v, i
		}
	}
	// Logprobs are of the raw distribution, so take what they need from x
	// before any processing changes it.
	var raw rawLogprobs
	if s.logprobs >= 0 {
		raw = rawLogprobsOf(x, rawMax, s.logprobs, sc)
	}
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
	if processed {
		sc.wRaw = false
	}

	var tok int32
	switch {
	case s.greedy && !processed:
		tok = int32(rawArg)
	case s.greedy:
		tok = argmax(x)
	default:
		tok = s.sampleRandom(x, u, sc)
	}
	if s.logprobs < 0 {
		return tok, nil
	}
	return tok, raw.logprob(tok, logits[tok])
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
	cs := s.candidates(x, sc)
	if len(cs) == 0 {
		return argmax(x)
	}
	return draw(cs, u)
}

// draw picks from non-empty cs with probability proportional to weight,
// walking in order until the running sum passes u times the total.
func draw(cs []cand, u float64) int32 {
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

// sampleDense draws from temperature and min-p alone, walking the dense
// weights in id order without building a candidate list; it draws the same
// token as sampleRandom over candidates would.
func (s *Sampler) sampleDense(x []float32, u float64, sc *scratch) int32 {
	m := negInf
	for _, v := range x {
		m = max(m, v)
	}
	if math.IsInf(float64(m), 0) {
		return argmax(x)
	}
	w := sc.w[:len(x)]
	total := sc.wSum
	if !s.reuseRaw(sc) {
		total = expSum(w, x, m, 1/s.temperature)
	}
	if s.minP > 0 {
		total = 0
		for i, wi := range w {
			if wi < s.minP {
				w[i] = 0
			}
			total += float64(w[i])
		}
	}
	target := u * total
	var acc float64
	last := int32(-1)
	for i, wi := range w {
		if wi > 0 {
			acc += float64(wi)
			if acc > target {
				return int32(i)
			}
			last = int32(i)
		}
	}
	if last < 0 {
		return argmax(x)
	}
	return last // rounding left target at or beyond the sum
}

// reuseRaw reports whether sc.w already holds this call's sampling weights:
// the logprobs pass computed exp(x - max) over unprocessed logits, which are
// the weights at temperature 1 (the API default).
func (s *Sampler) reuseRaw(sc *scratch) bool {
	return sc.wRaw && s.temperature == 1
}

// candidates returns the tokens that survive temperature, top-k, top-p and
// min-p with their unnormalized probabilities, in no particular order. It
// returns nil when no token has a finite logit or one is +Inf; the caller
// then falls back to argmax.
func (s *Sampler) candidates(x []float32, sc *scratch) []cand {
	invT := 1 / s.temperature
	cs := sc.cands[:0]
	m := negInf
	var z float64
	if s.topK > 0 && s.topK < len(x) {
		// Candidates are the ids at or above the k-th largest logit (ties
		// at the k-th value are all kept, as in vLLM).
		threshold := kthLargest(x, s.topK, sc)
		for i, v := range x {
			if v >= threshold && v > negInf {
				cs = append(cs, cand{id: int32(i)})
				m = max(m, v)
			}
		}
		if len(cs) == 0 || math.IsInf(float64(m), 1) {
			return nil
		}
		w := sc.vals[:0]
		for _, c := range cs {
			w = append(w, x[c.id])
		}
		sc.vals = w
		z = expSum(w, w, m, invT)
		for j := range cs {
			cs[j].w = w[j]
		}
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
	} else {
		for _, v := range x {
			m = max(m, v)
		}
		if math.IsInf(float64(m), 0) {
			return nil
		}
		w := sc.w[:len(x)]
		z = sc.wSum
		if !s.reuseRaw(sc) {
			z = expSum(w, x, m, invT)
		}
		// Tokens of weight 0 add no mass and cannot be drawn, so they are
		// left out; min-p (see below) is applied in the same pass. So are
		// tokens that cannot be in the top-p nucleus: a token is dropped
		// when it and all lighter tokens weigh at most (1-p)*z, which holds
		// for every token of weight <= (1-p)*z/V, since at most V tokens
		// weigh no more than it. For a typical spread of logits this leaves
		// the nucleus search a small fraction of the vocabulary.
		floor := s.minP
		var tail float32
		if s.topP > 0 {
			tail = float32((1 - float64(s.topP)) * z / float64(len(x)))
		}
		for i, wi := range w {
			if wi > tail && wi >= floor {
				cs = append(cs, cand{w: wi, id: int32(i)})
			}
		}
	}
	sc.cands = cs
	// vLLM applies top-p and then min-p. min-p keeps the tokens whose
	// probability is at least min_p times the largest, i.e. weight >= min_p
	// here (the largest weight is exp(0) = 1); both keep a prefix of the
	// tokens in descending order, so filtering min-p first (above) and then
	// cutting the nucleus at top_p of the full mass z gives the same set,
	// cheaper.
	if s.topP > 0 {
		cs = cs[:nucleus(cs, float64(s.topP)*z)]
	}
	return cs
}

// argmax returns the index of the largest value, the lowest on ties; NaN
// never wins, and with no value above -Inf it returns 0.
func argmax(x []float32) int32 {
	best, bv := 0, negInf
	for i, v := range x {
		if v > bv {
			best, bv = i, v
		}
	}
	return int32(best)
}

// rawLogprobs holds what the logprobs of one position need from the raw
// logits: their maximum, log-sum-exp and top entries.
type rawLogprobs struct {
	max, logZ float32
	top       []entry // best first
}

// rawLogprobsOf computes the log-softmax normalizer and the top n entries of
// x, whose maximum is m and which holds no NaN. The result refers to sc.
func rawLogprobsOf(x []float32, m float32, n int, sc *scratch) rawLogprobs {
	r := rawLogprobs{max: m}
	if n > 0 {
		h := sc.heap[:0]
		for i, v := range x {
			// Most entries lose to the heap's worst; test that first.
			if len(h) < n || v > h[0].v {
				h = heapOffer(h, n, entry{v: v, id: int32(i)})
			}
		}
		sc.heap = h
		r.top = append(sc.top[:0], h...)
		sc.top = r.top
		slices.SortFunc(r.top, func(a, b entry) int {
			if a.better(b) {
				return -1
			}
			return 1
		})
	}
	if !math.IsInf(float64(m), 0) {
		sc.wSum = expSum(sc.w[:len(x)], x, m, 1)
		sc.wRaw = true
		r.logZ = float32(math.Log(sc.wSum))
	}
	return r
}

// of returns the raw log-probability of a token with logit v.
func (r *rawLogprobs) of(v float32) float32 {
	switch {
	case v != v:
		return negInf
	case math.IsInf(float64(r.max), 0):
		// No finite normalizer: all mass is on the +Inf logits, if any.
		if v == r.max && v > 0 {
			return 0
		}
		return negInf
	}
	return (v - r.max) - r.logZ
}

// logprob builds the result for the chosen token tok with raw logit v.
func (r *rawLogprobs) logprob(tok int32, v float32) *Logprob {
	lp := &Logprob{Token: tok, Logprob: r.of(v)}
	if len(r.top) > 0 {
		lp.Top = make([]TopLogprob, len(r.top))
		for j, e := range r.top {
			lp.Top[j] = TopLogprob{Token: e.id, Logprob: r.of(e.v)}
		}
	}
	return lp
}
