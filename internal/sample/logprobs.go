package sample

import "math"

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

// rawLogprobs holds what the logprobs of one position need from the raw
// logits: the shift and log-sum-exp of their exponentials, and the top
// entries.
type rawLogprobs struct {
	// max is the shift of the exponentials, close to the largest logit;
	// if that is not finite, it is the largest logit (-Inf or +Inf).
	max, logZ float32
	top       []entry // best first
}

// rawLogprobsOf computes the log-softmax normalizer and the top n entries of
// the logits into sc.raw. The result refers to sc.
func rawLogprobsOf(logits []float32, n int, sc *scratch) rawLogprobs {
	r := &sc.raw
	r.fill(logits, 1)
	t := &sc.heap
	t.reset(n)
	res := rawLogprobs{max: r.max}
	switch {
	case !r.ok && n > 0:
		t.scan(r.x, 0)
	case r.ok:
		res.max, res.logZ = r.shift, float32(math.Log(r.total))
		if n > 0 {
			searchBlocks(t, r, sc)
		}
	}
	// Kept apart from the heap, which top-k sampling reuses.
	sc.top = append(sc.top[:0], t.sorted()...)
	res.top = sc.top
	return res
}

// searchBlocks offers the raw logits of r to t block by block, skipping
// every block that cannot hold an entry good enough: its exponentials sum
// to less than one entry at t's threshold would weigh. It starts with the
// blocks of the largest sums, which raises the threshold early. For logits
// as spread as a language model's it reads a small part of the row.
func searchBlocks(t *topHeap, r *expRow, sc *scratch) {
	x, sums := r.x, r.sums
	sc.seen = resize(sc.seen, len(sums))
	clear(sc.seen)
	search := func(b int) {
		sc.seen[b] = true
		t.scan(x[b*sumBlock:min(len(x), (b+1)*sumBlock)], b*sumBlock)
	}
	for range min(t.k, len(sums)) {
		best := -1
		for b, s := range sums {
			if !sc.seen[b] && (best < 0 || s > sums[best]) {
				best = b
			}
		}
		search(best)
	}
	thr, bound := negInf, float32(0)
	for b, s := range sums {
		if sc.seen[b] {
			continue
		}
		if v := t.threshold(); v != thr {
			thr, bound = v, weightBound(v-r.shift)
		}
		if s >= bound {
			search(b)
		}
	}
}

// weightBound returns a number at most the weight tensor.ExpSum gives an
// entry d above the shift, allowing for its few-ulp error and the rounding
// of d; 0 where the weight could be subnormal.
func weightBound(d float32) float32 {
	if d < -80 {
		return 0
	}
	return float32(math.Exp(float64(d)) * (1 - 1e-4))
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

// logprob builds the result for the chosen token tok with raw logit v and
// the best n alternatives.
func (r *rawLogprobs) logprob(tok int32, v float32, n int) *Logprob {
	lp := &Logprob{Token: tok, Logprob: r.of(v)}
	if n = min(n, len(r.top)); n > 0 {
		lp.Top = make([]TopLogprob, n)
		for j, e := range r.top[:n] {
			lp.Top[j] = TopLogprob{Token: e.id, Logprob: r.of(e.v)}
		}
	}
	return lp
}
