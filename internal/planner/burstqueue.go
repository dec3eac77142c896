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

// burstReplicas bounds the bursts played out at a valuation: about
// burstDraws requests in all, at least minBurstReplicas bursts.
const (
	burstDraws       = 1024
	minBurstReplicas = 8
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
	// before it (the first of a burst 0), kind and service its kind and
	// time on its engine (s): a remote prompt's prefill, a local one's
	// time to its first token on an idle decode.
	gap     []float64
	kind    []burstKind
	service []float64
	// free is scratch: each engine's time it is next free.
	free []float64
}

// newBurstQueue draws bursts of n requests from the window's, each of
// kinds[i] with services[i].
func newBurstQueue(n int, kinds []burstKind, services []float64) *burstQueue {
	if n <= 0 || len(kinds) == 0 {
		return nil
	}
	reps := max(burstDraws/n, minBurstReplicas)
	q := &burstQueue{n: n, reps: reps, gap: make([]float64, n*reps), kind: make([]burstKind, n*reps),
		service: make([]float64, n*reps)}
	rng := rand.New(rand.NewPCG(26, uint64(n)))
	for i := range q.gap {
		if i%n != 0 {
			q.gap[i] = rng.ExpFloat64()
		}
		j := rng.IntN(len(kinds))
		q.kind[i], q.service[i] = kinds[j], services[j]
	}
	return q
}

// met plays the bursts out at p prefill and d decode engines, the burst
// arriving at lambda requests/s, and returns the fractions of its
// requests that meet ttft seconds, and of those that miss it among the
// remote and the local prompts. A remote prompt's TTFT counts over
// (its KV transfer) and leg (its decode leg) beyond its prefill's end.
func (q *burstQueue) met(p, d int, lambda, ttft, over, leg float64) (met, remoteMiss, localMiss float64) {
	if cap(q.free) < p+d {
		q.free = make([]float64, p+d)
	}
	pre, dec := q.free[:p], q.free[p:p+d]
	var hit, rmiss, lmiss int
	for r := range q.reps {
		clear(q.free[:p+d])
		t := 0.0
		for i := r * q.n; i < (r+1)*q.n; i++ {
			if lambda > 0 {
				t += q.gap[i] / lambda
			} else { // each request alone: an idle engine
				t = 0
				clear(q.free[:p+d])
			}
			var servers []float64
			extra := 0.0
			switch q.kind[i] {
			case burstCached:
				hit++
				continue
			case burstRemote:
				servers, extra = pre, over+leg
			default:
				servers = dec
			}
			if len(servers) == 0 {
				if q.kind[i] == burstRemote {
					rmiss++
				} else {
					lmiss++
				}
				continue
			}
			k := 0
			for j := 1; j < len(servers); j++ {
				if servers[j] < servers[k] {
					k = j
				}
			}
			done := math.Max(t, servers[k]) + q.service[i]
			servers[k] = done
			switch {
			case done-t+extra <= ttft:
				hit++
			case q.kind[i] == burstRemote:
				rmiss++
			default:
				lmiss++
			}
		}
	}
	all := float64(q.n * q.reps)
	return float64(hit) / all, float64(rmiss) / all, float64(lmiss) / all
}

// burstRateBound is how far past the sustained capacity a burst's rate is
// valued: a split whose bursts meet the objectives arriving even faster
// is credited this much, so that splits that all do are ranked by their
// sustained capacity.
const burstRateBound = 4
