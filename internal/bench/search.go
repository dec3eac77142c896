package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// SearchConfig bounds a search for the highest rate that meets a goodput
// target.
type SearchConfig struct {
	// Target is the fraction of requests that must meet the SLO (DistServe
	// uses 0.9).
	Target float64 `json:"target"`
	// Low and High bracket the rate (requests/s). The search first checks
	// Low (if it fails, the answer is "below Low"), then doubles towards
	// High until a rate fails, then bisects.
	Low, High float64
	// Steps is the number of bisection steps after the bracket is found.
	Steps int `json:"steps"`
	// Duration, if set, makes every rate tried last about as long: it
	// sends the first max(MinRequests, ⌈rate·Duration⌉) conversations of
	// the plan's workload (all of them if it has fewer; build it with
	// High·Duration), where otherwise every rate sends the whole workload
	// and a low rate's level lasts longer than a high one's. A queue needs
	// about as long to fill at every rate, so a level of fixed length
	// measures each rate as far into its steady state. Not for timed
	// arrivals (a trace).
	Duration    time.Duration `json:"duration_ns,omitempty"`
	MinRequests int           `json:"min_requests,omitempty"`
	// Observe, if set, is called before each rate is tried, and the
	// function it returns (if not nil) with that level's result after it
	// ran: a caller watches the host around each level with it.
	Observe func(target string, rate float64) func(*Result) `json:"-"`
}

// SearchPoint is one rate tried (or measured) and what it attained: the
// fraction of requests meeting the SLO, those per second (goodput), and the
// completed requests and output tokens per second.
type SearchPoint struct {
	Rate              float64 `json:"rate"`
	Attainment        float64 `json:"attainment"`
	Goodput           float64 `json:"goodput_rps"`
	RequestThroughput float64 `json:"request_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
}

// SearchResult is the outcome of a rate search for one target: the highest
// rate tried that met the target (0 if none did), and every point tried,
// which is the attainment-versus-rate curve the single number comes from.
type SearchResult struct {
	Target  string  `json:"target"`
	MaxRate float64 `json:"max_rate"`
	// FirstMiss is the lowest rate tried that missed the target (the top
	// of the final bracket), 0 when every rate up to High met it.
	FirstMiss float64       `json:"first_miss,omitempty"`
	Points    []SearchPoint `json:"points"`
	Results   []*Result     `json:"-"`
}

// Bound is how MaxRate bounds the goodput rate: BoundBelow when even the
// lowest rate tried missed, BoundAtLeast when every rate up to the search's
// top met the goal, else BoundSearch.
func (sr SearchResult) Bound() Bound {
	switch {
	case sr.MaxRate == 0:
		return BoundBelow
	case sr.FirstMiss == 0:
		return BoundAtLeast
	}
	return BoundSearch
}

// SearchRate finds, for each target of p, the highest Poisson rate at which
// at least cfg.Target of the requests meet p.SLO. Each rate tried runs p's
// workload once (all rounds), so a search costs a few full runs. Rates are
// searched per target, one target at a time.
func SearchRate(ctx context.Context, p *Plan, cfg SearchConfig, log io.Writer) ([]SearchResult, error) {
	if !p.SLO.Set() {
		return nil, fmt.Errorf("the rate search needs an SLO: give --slo-ttft and/or --slo-tpot")
	}
	if cfg.Target <= 0 || cfg.Target > 1 || cfg.Low <= 0 || cfg.High < cfg.Low {
		return nil, fmt.Errorf("rate search: target %v in (0, 1] and 0 < low %v <= high %v wanted", cfg.Target, cfg.Low, cfg.High)
	}
	var out []SearchResult
	for _, t := range p.Targets {
		sr := SearchResult{Target: t.Name}
		try := func(rate float64) (bool, error) {
			q := *p
			q.Targets = []Target{t}
			q.FirstLevel = p.FirstLevel + len(sr.Points)*max(p.Rounds, 1) // fresh prompts for every rate tried
			q.Loads = []Load{{Rate: rate, Burstiness: burstinessOf(p)}}
			if cfg.Duration > 0 && p.Workload != nil && !p.Workload.TimedArrivals {
				n := max(cfg.MinRequests, 1, int(math.Ceil(rate*cfg.Duration.Seconds())))
				if n < len(p.Workload.Conversations) {
					w := *p.Workload
					w.Conversations = w.Conversations[:n]
					q.Workload = &w
				}
			}
			var done func(*Result)
			if cfg.Observe != nil {
				done = cfg.Observe(t.Name, rate)
			}
			s, err := Run(ctx, &q)
			if err != nil {
				return false, err
			}
			r := s.Results[0]
			if done != nil {
				done(r)
			}
			sr.Points = append(sr.Points, r.point())
			sr.Results = append(sr.Results, r)
			ok := r.Attained >= cfg.Target
			if log != nil {
				fmt.Fprintf(log, "search %s: rate %.3g req/s: %.0f%% met the SLO (%s)\n", t.Name, rate, 100*r.Attained, map[bool]string{true: "meets", false: "misses"}[ok])
			}
			return ok, nil
		}
		ok, err := try(cfg.Low)
		if err != nil {
			return out, err
		}
		if !ok {
			sr.FirstMiss = cfg.Low
		}
		if ok {
			lo, hi := cfg.Low, 0.0
			for r := cfg.Low * 2; hi == 0; r *= 2 {
				r = min(r, cfg.High)
				ok, err := try(r)
				if err != nil {
					return out, err
				}
				if !ok {
					hi = r
				} else {
					lo = r
					if r == cfg.High {
						break
					}
				}
			}
			for i := 0; i < cfg.Steps && hi > 0; i++ {
				mid := (lo + hi) / 2
				ok, err := try(mid)
				if err != nil {
					return out, err
				}
				if ok {
					lo = mid
				} else {
					hi = mid
				}
			}
			sr.MaxRate, sr.FirstMiss = lo, hi
		}
		out = append(out, sr)
	}
	return out, nil
}

func burstinessOf(p *Plan) float64 {
	if len(p.Loads) > 0 {
		return p.Loads[0].Burstiness
	}
	return 0
}

// SearchSuite is a rate search for goal (SearchConfig.Target) as a Suite,
// for the table and the JSON of a plain run: every rate tried is a result (by target, in rate order), and
// each target's Capacity has the search's answer as its goodput rate
// (BoundSearch, or BoundBelow / BoundAtLeast when the search ran off its
// range), with the throughput of every rate tried.
func SearchSuite(p *Plan, goal float64, res []SearchResult) *Suite {
	s := &Suite{Plan: p, Search: res}
	for _, sr := range res {
		rs := slices.Clone(sr.Results)
		slices.SortStableFunc(rs, func(a, b *Result) int { return cmp.Compare(a.Load.Rate, b.Load.Rate) })
		s.Results = append(s.Results, rs...)
	}
	s.Capacity = capacities(s, goal)
	for i := range s.Capacity {
		c := &s.Capacity[i]
		for _, sr := range res {
			if sr.Target != c.Target {
				continue
			}
			c.GoodputRate, c.FirstMiss, c.Bound = sr.MaxRate, sr.FirstMiss, sr.Bound()
		}
	}
	return s
}
