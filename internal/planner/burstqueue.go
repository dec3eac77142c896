package planner

import (
	"math"
	"math/rand/v2"
)

// A burst's TTFTs. Where the arrivals come in bursts (Fit.BurstRequests),
// the queues before a first token are valued as one burst of that many
// requests arriving at the rate valued, from empty queues, rather than as
// that rate sustained with the bursts' dispersion as its variability: a
// level of the P/D experiment's long mix (16 prompts of 1,024–2,048
// tokens) at 4 req/s was priced missing 59% of 3P:1D's remote TTFTs and
// 31% of the colocated split's local ones, where both met every one, and
// at 8 req/s, above the prefill engines' sustained capacity, a burst of
// 16 still met 77% (3P:1D) and 100% (0P:4D). The burst is played out on
// the split's servers: its requests drawn from the window's, each arriving
// after an exponential gap (Poisson arrivals within the burst), a remote
// prompt prefilled by the prefill engine free first and a local one by
// the decode free first (the router's queue-aware pick), each engine in
// arrival order. The same draws value every split, threshold and rate
// (common random numbers): the comparison between splits carries no
// sampling noise of its own, and a higher rate, the same gaps scaled down,
// never meets more.

// burstDraws is about how many requests a valuation plays out: bursts of
// the window's size, as many as make burstDraws (one at least). A burst of
// more than maxBurstRequests is valued as sustained traffic: its queues
// reach their steady state within it.
const (
	burstDraws       = 1024
	maxBurstRequests = 1024
)

// burstKind is how a request reaches its first token.
type burstKind uint8

const (
	burstCached burstKind = iota // no uncached token: a decode step
	burstLocal                   // prefilled by its decode
	burstRemote                  // prefilled by a prefill engine
)

// burstQueue is the draws a split's burst is played out with.
type burstQueue struct {
	n, reps int
	// gap is each request's unit-rate exponential gap after the one
	// before it (the first of a burst 0), kind its kind, service a
	// remote prompt's prefill time (s) and tokens a local one's uncached
	// tokens.
	gap     []float64
	kind    []burstKind
	service []float64
	tokens  []float64
	// curve prices a decode's steps and chunk is its
	// --max-num-batched-tokens.
	curve PrefillCurve
	chunk float64
	// Scratch: the prefill engines' times they are next free; each
	// decode's local prompts waiting.
	free    []float64
	waiting [][]localPrompt
}

// localPrompt is a local prompt waiting on its decode: when it arrived,
// its tokens and how many of them are prefilled.
type localPrompt struct {
	at, tokens, done float64
}

// newBurstQueue draws bursts of n requests from the window's, each of
// kinds[i] with services[i] (a remote prompt's prefill seconds) and
// tokens[i] (a local prompt's uncached tokens), a decode's steps priced
// by curve in chunks of chunk tokens.
func newBurstQueue(n int, kinds []burstKind, services, tokens []float64, curve PrefillCurve, chunk float64) *burstQueue {
	if n <= 0 || n > maxBurstRequests || len(kinds) == 0 {
		return nil
	}
	reps := max(burstDraws/n, 1)
	q := &burstQueue{n: n, reps: reps, gap: make([]float64, n*reps), kind: make([]burstKind, n*reps),
		service: make([]float64, n*reps), tokens: make([]float64, n*reps), curve: curve, chunk: max(chunk, 1)}
	rng := rand.New(rand.NewPCG(26, uint64(n)))
	for i := range q.gap {
		if i%n != 0 {
			q.gap[i] = rng.ExpFloat64()
		}
		j := rng.IntN(len(kinds))
		q.kind[i], q.service[i], q.tokens[i] = kinds[j], services[j], tokens[j]
	}
	return q
}

// met plays the bursts out at p prefill and d decode engines, the burst
// arriving at lambda requests/s and each decode carrying batch streams,
// and returns the fractions of its requests that meet ttft seconds, and
// of those that miss it among the remote and the local prompts. A remote
// prompt's TTFT counts over (its KV transfer) and leg (its decode leg)
// beyond its prefill's end. The local prompts are dealt to the decodes in
// turn (the router's count of each decode's requests), and each decode
// serves its own in steps (localSteps).
func (q *burstQueue) met(p, d int, lambda, batch, ttft, over, leg float64) (met, remoteMiss, localMiss float64) {
	if cap(q.free) < p {
		q.free = make([]float64, p)
	}
	if len(q.waiting) < d {
		q.waiting = make([][]localPrompt, d)
	}
	pre := q.free[:p]
	var hit, rmiss, lmiss int
	for r := range q.reps {
		clear(pre)
		for k := range d {
			q.waiting[k] = q.waiting[k][:0]
		}
		t, next := 0.0, 0
		for i := r * q.n; i < (r+1)*q.n; i++ {
			if lambda > 0 {
				t += q.gap[i] / lambda
			} else { // each request alone: idle engines
				t = float64(i) * 1e6
			}
			switch q.kind[i] {
			case burstCached:
				hit++
			case burstLocal:
				if d == 0 {
					lmiss++
					continue
				}
				q.waiting[next] = append(q.waiting[next], localPrompt{at: t, tokens: q.tokens[i]})
				next = (next + 1) % d
			default:
				if p == 0 {
					rmiss++
					continue
				}
				// pre is a min-heap of the engines' free times: the
				// root is the engine free first.
				done := math.Max(t, pre[0]) + q.service[i]
				pre[0] = done
				siftDown(pre)
				if done-t+over+leg <= ttft {
					hit++
				} else {
					rmiss++
				}
			}
		}
		for k := range d {
			h := q.localSteps(q.waiting[k], batch, ttft)
			hit += h
			lmiss += len(q.waiting[k]) - h
		}
	}
	all := float64(q.n * q.reps)
	return float64(hit) / all, float64(rmiss) / all, float64(lmiss) / all
}

// localSteps serves one decode's local prompts, in arrival order, in the
// engine's steps: each step takes the waiting prompts' tokens first come
// first served up to the chunk less the step's batch decodes, and costs
// the curve at its tokens and decodes together plus, for a piece of a
// prompt after its start, that piece's attention over the prompt's
// earlier tokens (the curve's increment beyond its own). A prompt's first
// token comes with the step that prefills its last piece. It returns how
// many meet ttft seconds.
func (q *burstQueue) localSteps(ps []localPrompt, batch, ttft float64) (met int) {
	budget := max(q.chunk-math.Ceil(batch), 1)
	c := q.curve
	now, head, arrived := 0.0, 0, 0
	for head < len(ps) {
		if arrived == head { // idle until the next prompt
			now = math.Max(now, ps[head].at)
		}
		for arrived < len(ps) && ps[arrived].at <= now {
			arrived++
		}
		var tokens, extra float64
		last := head // the prompts up to last (exclusive) finish in this step
		for j := head; j < arrived && tokens < budget; j++ {
			piece := math.Min(ps[j].tokens-ps[j].done, budget-tokens)
			if pos := ps[j].done; pos > 0 {
				extra += math.Max(c.Seconds(pos+piece)-c.Seconds(pos)-c.Seconds(piece)+c.A, 0)
			}
			ps[j].done += piece
			tokens += piece
			if ps[j].done >= ps[j].tokens {
				last = j + 1
			}
		}
		now += c.Seconds(tokens+math.Max(batch, 0)) + extra
		for ; head < last; head++ {
			if now-ps[head].at <= ttft {
				met++
			}
		}
	}
	return met
}

// burstRateBound is how far past the sustained capacity a burst's rate is
// valued: a split whose bursts meet the objectives arriving even faster
// is credited this much, so that splits that all do are ranked by their
// sustained capacity.
const burstRateBound = 4

// siftDown restores the min-heap h after its root grew.
func siftDown(h []float64) {
	i := 0
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1] < h[c] {
			c++
		}
		if h[i] <= h[c] {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}
