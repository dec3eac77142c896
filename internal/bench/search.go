package bench

import (
	"context"
	"fmt"
	"io"
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
}

// SearchPoint is one rate tried and what it attained.
type SearchPoint struct {
	Rate       float64 `json:"rate"`
	Attainment float64 `json:"attainment"`
	Goodput    float64 `json:"goodput_rps"`
}

// SearchResult is the outcome of a rate search for one target: the highest
// rate tried that met the target (0 if none did), and every point tried,
// which is the attainment-versus-rate curve the single number comes from.
type SearchResult struct {
	Target  string        `json:"target"`
	MaxRate float64       `json:"max_rate"`
	Points  []SearchPoint `json:"points"`
	Results []*Result     `json:"-"`
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
			q.levelBase = p.levelBase + len(sr.Points)*max(p.Rounds, 1) // fresh prompts for every rate tried
			q.Loads = []Load{{Rate: rate, Burstiness: burstinessOf(p)}}
			s, err := Run(ctx, &q)
			if err != nil {
				return false, err
			}
			r := s.Results[0]
			sr.Points = append(sr.Points, SearchPoint{Rate: rate, Attainment: r.Attained, Goodput: r.Goodput})
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
			sr.MaxRate = lo
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
