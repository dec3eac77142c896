package planner

import (
	"maps"
	"math"
	"slices"
)

// stalls is what local prefills cost the streams of a decode engine. A
// local prefill of L tokens takes s·L seconds of the engine's steps, which
// every stream running then waits through: in one step when L fits the
// engine's chunk (--max-num-batched-tokens), else one chunk per step, so a
// stream of O output tokens waits at most one chunk's time in each of its
// O − 1 steps. A stream meets the TPOT objective when its step time plus
// the stalls it waited, spread over its O − 1 steps, stays within it.
//
// The mean of those stalls is the engine's prefill share ρ (the stretch
// decodeRateWithLocal applies), but streams do not all wait the mean: a
// short answer that meets one long prefill misses the objective although
// the mean is well within it. missed counts those streams: the window's
// requests as streams, each meeting a Poisson number of the local prompts
// (arriving at the engine's local rate over the stream's life) drawn from
// the window's local prompt lengths.
type stalls struct {
	// prefill is each local prompt's prefill time (s), ascending.
	prefill []float64
	// streams are the window's requests as streams on a decode.
	streams []stream
	// chunk is one step's most prefill time: the chunk's tokens' (s).
	chunk float64
	// n is how many requests streams stands for (those without a TPOT
	// included).
	n float64
}

// stream is one request's decode as local prefills see it.
type stream struct {
	steps float64 // output tokens after its first
	// weight is how many of the window's streams have as many steps.
	weight float64
	// mean and meanSq are the mean and mean square of the stall one local
	// prefill costs it (its prefill time, capped by a chunk a step over
	// its steps).
	mean, meanSq float64
}

// maxStreams bounds the streams the stall model counts per decision.
const maxStreams = 64

// newStalls is the stall model of the local prompts' prefill times
// (seconds) for the streams of reqs, at chunk seconds of prefill per step.
func newStalls(local []float64, reqs []Request, chunk float64) *stalls {
	st := &stalls{prefill: slices.Sorted(slices.Values(local)), chunk: chunk}
	reqs = sample(reqs, maxStreams)
	st.n = float64(len(reqs))
	weight := map[int]float64{}
	for _, r := range reqs {
		if r.OutputTokens > 1 { // else no TPOT to miss
			weight[r.OutputTokens-1]++
		}
	}
	for _, steps := range slices.Sorted(maps.Keys(weight)) {
		s := stream{steps: float64(steps), weight: weight[steps]}
		most := chunk * s.steps
		for _, x := range st.prefill {
			x = min(x, most)
			s.mean += x
			s.meanSq += x * x
		}
		s.mean /= float64(max(len(st.prefill), 1))
		s.meanSq /= float64(max(len(st.prefill), 1))
		st.streams = append(st.streams, s)
	}
	return st
}

// missed is the fraction of streams that miss the TPOT objective slo
// (seconds) on an engine whose steps take step seconds when local prefills
// arrive at it at rate per second and take a share rho of its time (a
// stream's life is its steps at step/(1−ρ)). A stream's stall total is
// compound Poisson; its tail is taken as the larger of a normal
// approximation's (many small stalls) and that of one stall alone past the
// stream's slack (few long ones).
func (st *stalls) missed(rate, rho, step, slo float64) float64 {
	if st == nil || len(st.prefill) == 0 || rate <= 0 || st.n == 0 {
		return 0
	}
	if rho >= 1 {
		return 1
	}
	var missed float64
	for _, s := range st.streams {
		slack := (slo - step) * s.steps
		if slack < 0 {
			missed += s.weight
			continue
		}
		if slack >= st.chunk*s.steps {
			continue // a chunk in every one of its steps still meets it
		}
		arrivals := rate * s.steps * step / (1 - rho)
		// One stall alone past the slack: the prompts longer than it.
		var p float64
		if over := len(st.prefill) - atMost(st.prefill, slack); over > 0 {
			p = 1 - math.Exp(-arrivals*float64(over)/float64(len(st.prefill)))
		}
		if v := arrivals * s.meanSq; v > 0 {
			z := (slack - arrivals*s.mean) / math.Sqrt(v)
			p = max(p, 0.5*math.Erfc(z/math.Sqrt2))
		}
		missed += s.weight * p
	}
	return missed / st.n
}

// atMost is how many of the ascending xs are at most x.
func atMost(xs []float64, x float64) int {
	i, _ := slices.BinarySearchFunc(xs, x, func(a, b float64) int {
		if a <= b {
			return -1
		}
		return 1
	})
	return i
}
