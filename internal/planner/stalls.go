package planner

import (
	"cmp"
	"maps"
	"math"
	"slices"
)

// stalls is what local prefills cost the streams of a decode engine. A
// local prefill of L tokens takes s·L seconds of the engine's steps, and
// every stream running then waits through what those steps take beyond
// the decode steps they stand in for (the streams' tokens ride in them;
// capacity.model): in one step when L fits the
// engine's chunk (--max-num-batched-tokens), else one chunk per step, so a
// stream of O output tokens waits at most one chunk's time in each of its
// O − 1 steps. A stream meets the TPOT objective when its step time plus
// the stalls it waited, spread over its O − 1 steps, stays within it.
//
// The mean of those stalls is the engine's prefill share ρ (the stretch
// decodeRateWithLocal applies), but streams do not all wait the mean: a
// short answer that meets one long prefill misses the objective although
// the mean is well within it. missed counts those streams: the window's
// requests as streams, each meeting the prefill work the engine holds when
// it starts (residual work, seen with the probability the engine is busy
// with it) and a Poisson number of the local prompts arriving over its
// life, drawn from the window's local prompt lengths.
type stalls struct {
	// prefill is each local prompt's prefill time (s), ascending, and
	// above[i] the sum of prefill[i:].
	prefill, above []float64
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

// maxStreams bounds the requests the stall model takes as streams, and
// streamGroups the groups it counts them in (by their steps, each group
// as its shortest stream: the least slack).
const (
	maxStreams   = 64
	streamGroups = 12
)

// newStalls is the stall model of the local prompts' prefill times
// (seconds) for the streams of reqs, at chunk seconds of prefill per step.
func newStalls(local []float64, reqs []Request, chunk float64) *stalls {
	st := &stalls{prefill: slices.Sorted(slices.Values(local)), chunk: chunk}
	st.above = make([]float64, len(st.prefill)+1)
	for i := len(st.prefill) - 1; i >= 0; i-- {
		st.above[i] = st.above[i+1] + st.prefill[i]
	}
	reqs = sample(reqs, maxStreams)
	st.n = float64(len(reqs))
	var steps []int
	for _, r := range reqs {
		if r.OutputTokens > 1 { // else no TPOT to miss
			steps = append(steps, r.OutputTokens-1)
		}
	}
	slices.Sort(steps)
	weight := map[int]float64{}
	per := max(len(steps)/streamGroups, 1)
	for i := 0; i < len(steps); i += per {
		weight[steps[i]] += float64(min(per, len(steps)-i))
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
// the residual prefill work it finds plus a compound Poisson sum; its tail
// is taken as the larger of two bounds: one stall alone past the stream's
// slack (a prefill found under way with more than the slack left, the
// engine being in one a share rate·E[(X − slack)⁺] of its time, or one
// arriving that is longer than the slack), and enough stalls of the mean
// size to fill it (a Poisson count, its mean the arrivals and ρ for the
// work found). At most most local prefills arrive over a stream's life
// (+Inf: no bound; a burst's local prompts on the decode).
func (st *stalls) missed(rate, rho, step, slo, most float64) float64 {
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
		arrivals := min(rate*s.steps*step/(1-rho), most)
		n := float64(len(st.prefill))
		var p float64
		if i := atMost(st.prefill, slack); i < len(st.prefill) {
			found := min(rate*(st.above[i]-float64(len(st.prefill)-i)*slack)/n, 1)
			p = 1 - (1-found)*math.Exp(-arrivals*float64(len(st.prefill)-i)/n)
		}
		if s.mean > 0 {
			p = max(p, poissonAtLeast(arrivals+rho, math.Floor(slack/s.mean)+1))
		}
		missed += s.weight * p
	}
	return missed / st.n
}

// longest is the longest local prefill (seconds) that, landing on the
// window's streams at once, leaves at most a share budget of them past the
// TPOT objective slo at step seconds a step: a stream of S steps absorbs a
// stall of (slo − step)·S, and one of chunk·S whatever the prompt. It is
// +Inf when every stream absorbs a chunk in each of its steps.
func (st *stalls) longest(step, slo, budget float64) float64 {
	if st == nil || st.n == 0 {
		return math.Inf(1)
	}
	// The streams by the stall they absorb, ascending: the longest prefill
	// is the one that breaks just the budget's share of them.
	type absorb struct{ stall, weight float64 }
	var as []absorb
	for _, s := range st.streams {
		a := max((slo-step)*s.steps, 0)
		if a >= st.chunk*s.steps {
			a = math.Inf(1)
		}
		as = append(as, absorb{a, s.weight})
	}
	slices.SortFunc(as, func(a, b absorb) int { return cmp.Compare(a.stall, b.stall) })
	broken := 0.0
	for _, a := range as {
		if broken+a.weight > budget*st.n {
			return a.stall
		}
		broken += a.weight
	}
	return math.Inf(1)
}

// poissonAtLeast is P(N ≥ k) for N Poisson of mean mu.
func poissonAtLeast(mu, k float64) float64 {
	if k <= 0 {
		return 1
	}
	if k > mu+12*math.Sqrt(mu)+12 {
		return 0 // under 1e-9
	}
	term, below := math.Exp(-mu), 0.0
	for i := 0.0; i < k; i++ {
		below += term
		term *= mu / (i + 1)
	}
	return max(1-below, 0)
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
