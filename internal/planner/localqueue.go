package planner

import (
	"math"
	"sort"
)

// localQueue is a decode engine's queue of local prompts, served in batches:
// each engine step admits the waiting prompts' tokens up to its chunk
// budget (--max-num-batched-tokens less the step's decodes, one token each)
// and runs them in one forward pass with the decodes. A prompt therefore
// does not hold the engine for a step and a fixed cost of its own, as a
// GI/G/1 server's customer would: a full step serves budget tokens of
// however many prompts (the chat mix's prompts under 256 tokens go two or
// three a step), and a prompt's share of the engine is its tokens' share
// of a full step. The queue is of those shares (capacity.localMet): its
// utilisation is the prompt tokens' arrival rate against a full step's. A
// prompt's time with no queue ahead (capacity.local: its prefill and the
// steps its chunks share) is unchanged.
type localQueue struct {
	// tokens are the local prompts' uncached tokens: their mean and
	// squared coefficient of variation, a share's.
	tokens, tokensCV2 float64
	// chunk is the decodes' --max-num-batched-tokens.
	chunk float64
}

// newLocalQueue is the queue of the local prompts of tokens uncached
// tokens each on decodes whose chunk is chunk tokens.
func newLocalQueue(tokens []float64, chunk float64) localQueue {
	q := localQueue{chunk: max(chunk, 1)}
	if len(tokens) == 0 {
		return q
	}
	q.tokens = Mean(tokens)
	if q.tokens > 0 {
		sd := StdDev(tokens)
		q.tokensCV2 = sd * sd / (q.tokens * q.tokens)
	}
	return q
}

// perToken is what one prompt token costs a decode engine at batch streams
// when its steps are full (s): a full step (the decode step at the batch,
// stepSec, and the budget's prompt tokens run beside the decodes' through
// the prefill curve: cv at budget + batch tokens less cv at the batch's)
// over its budget. The budget is at least one token.
func (q localQueue) perToken(cv PrefillCurve, batch, stepSec float64) float64 {
	budget := max(q.chunk-batch, 1)
	b := max(batch, 0)
	full := stepSec + max(cv.Seconds(budget+b)-cv.Seconds(b), 0)
	return full / budget
}

// service is a local prompt's mean share of a decode engine at batch
// streams and stepSec seconds a step (perToken times the mean prompt).
func (q localQueue) service(cv PrefillCurve, batch, stepSec float64) float64 {
	return q.tokens * q.perToken(cv, batch, stepSec)
}

// localMet is how many of the local prompts meet the TTFT objective on one
// of d decode engines serving perDecode requests/s at batch streams and
// step seconds a step (unstretched). A prompt waits for the tokens queued
// before it at its share of full steps (localQueue.service), then takes
// its time on an idle decode (capacity.local). Sustained arrivals are a
// GI/G/1 queue with the arrivals' ca2 (queueMet). A decode held by a
// burst (its batch at its share of the burst, burstShare) queues that
// burst's local prompts alone (burstQueueMet); while they arrive its
// batch grows from what the gap before the burst left (the drain: none)
// to that share, so they queue behind steps at half of it. (The prefill
// engines' queue stays the sustained one: at 1P:3D on the grid's chat
// levels it predicted the remote prompts' misses as measured, 92 / 86 /
// 76% met at 10 / 20 / 40 req/s against 92 / 82 / 77%, where a burst's
// walk predicted 94 / 89 / 81%.)
func (m *capacity) localMet(d int, perDecode, batch, step float64) float64 {
	most := m.burstShare(d)
	if batch >= most*(1-1e-9) {
		batch = max(batch/2, 1)
		step = m.f.stepMs(batch) / 1000
	}
	s := m.queue.service(m.curve, batch, step)
	rho := perDecode * m.localFraction * s
	if math.IsInf(most, 1) {
		return queueMet(m.local, s, m.f.arrivalCA2()/float64(d), m.queue.tokensCV2, 0, m.ttft, rho)
	}
	return burstQueueMet(m.local, s, m.queue.tokensCV2, m.ttft, rho, most*m.localFraction)
}

// burstPoints is how many of a burst's requests, evenly spread over it,
// stand for all of them in burstWaitMiss.
const burstPoints = 8

// burstQueueMet is how many of the requests whose times alone are services
// (sorted, shortest first) wait at most slo less that time in a queue that
// one burst of n of them fills: their shares of the server s on average
// (squared coefficient of variation cv2), arriving as a Poisson stream at
// the rate valued, which keeps the server busy ρ of the time (the index of
// dispersion measured over the bursts and the gaps between them is their
// on-off pattern; within a burst the arrivals are the rate valued). The
// queue holds no more than the burst: the j-th request waits for what the
// j − 1 before it bring beyond the time they take to arrive, a random walk
// of j − 1 steps from an empty queue (burstWaitMiss), where the sustained
// queue has walked for ever and past ρ = 1 grows without end. Below ρ = 1
// each request's wait is also at most the sustained queue's
// (stochastically), whose tail bounds the walk's where the Brownian one is
// loose, at light load. The share missing, smooth and monotone in the
// slack, is computed at burstKnots of the services and interpolated
// between them (the model values every split at every threshold some
// fifty times a decision). A count, not a fraction.
func burstQueueMet(services []float64, s, cv2, slo, rho, n float64) float64 {
	c := (1 + cv2) / 2
	miss := func(t float64) float64 {
		if rho < 1 && s > 0 {
			sustained := rho * math.Exp(-t*(1-rho)/(c*s))
			if sustained < 1e-6 { // the walk's can only be less
				return sustained
			}
			return min(sustained, burstWaitMiss(t, s, cv2, rho, n))
		}
		return burstWaitMiss(t, s, cv2, rho, n)
	}
	end := sort.SearchFloat64s(services, slo) // those with slack
	if end == 0 {
		return 0
	}
	stride := max(end/burstKnots, 1)
	mLo := miss(slo - services[0])
	missed := mLo
	for lo := 0; lo < end-1; {
		hi := min(lo+stride, end-1)
		mHi := miss(slo - services[hi])
		span := services[hi] - services[lo]
		for j := lo + 1; j <= hi; j++ {
			if span <= 0 {
				missed += mHi
				continue
			}
			missed += mLo + (mHi-mLo)*(services[j]-services[lo])/span
		}
		lo, mLo = hi, mHi
	}
	return float64(end) - missed
}

// burstKnots is how many of the services burstQueueMet computes the
// burst's queue at.
const burstKnots = 16

// burstWaitMiss is the share of a burst's n requests that wait longer
// than t at a server of mean service s (squared coefficient of variation
// cv2) fed by the burst's Poisson arrivals at load ρ: the j-th's wait is
// the largest of the last k steps' sums of a random walk, each step a
// service less an inter-arrival time (mean s·(1 − 1/ρ), variance
// s²·(cv2 + 1/ρ²)), taken as a Brownian motion's largest value over j − 1
// steps: P(max > t) = Φ̄((t − μn)/(σ√n)) + e^{2μt/σ²}·Φ̄((t + μn)/(σ√n)).
// burstPoints requests, evenly spread over the burst, stand for it.
func burstWaitMiss(t, s, cv2, rho, n float64) float64 {
	if s <= 0 || rho <= 0 || n <= 1 {
		return 0
	}
	mu := s * (1 - 1/rho)
	sigma := s * math.Sqrt(cv2+1/(rho*rho))
	tail := func(x float64) float64 { return 0.5 * math.Erfc(x/math.Sqrt2) }
	reflect := 0.0 // the reflected path's weight, e^{2μt/σ²}
	if e := 2 * mu * t / (sigma * sigma); e < 700 {
		reflect = math.Exp(e)
	}
	var miss float64
	for i := range burstPoints {
		k := (float64(i) + 0.5) / burstPoints * (n - 1) // requests before it
		sd := sigma * math.Sqrt(k)
		p := tail((t - mu*k) / sd)
		if reflect > 0 {
			p += reflect * tail((t+mu*k)/sd)
		}
		miss += min(p, 1)
	}
	return miss / burstPoints
}
