package bench

import (
	"cmp"
	"fmt"
	"slices"
)

// DefaultGoal is the fraction of requests that must meet the SLO for a rate
// to count as sustained: DistServe's 90%.
const DefaultGoal = 0.9

// Capacity is what one target sustained over a run's arrival rates: its
// goodput rate (the highest rate at which Goal of the requests met the SLO)
// and its peak throughput.
type Capacity struct {
	Target string  `json:"target"`
	Goal   float64 `json:"goal"`
	// GoodputRate is the highest arrival rate (requests/s) at which at
	// least Goal of the requests met the SLO, read off the measured rates
	// as Bound says.
	GoodputRate float64 `json:"goodput_rate"`
	// Bound says how GoodputRate was found:
	//   "interpolated": linearly between the last rate that met the goal
	//     and the first that missed it;
	//   "at least": every rate met the goal, GoodputRate is the highest
	//     measured (the true one is higher);
	//   "below": even the lowest rate missed the goal, GoodputRate is that
	//     rate (the true one is lower);
	//   "none": no rate levels (closed loops only).
	Bound string `json:"bound"`
	// NonMonotone says that a rate above the first miss met the goal again
	// (noise, or a quieter moment of the host): the estimate takes the first
	// miss.
	NonMonotone bool `json:"non_monotone,omitempty"`
	// Points are the measured (rate, attainment) pairs in rate order.
	Points []SearchPoint `json:"points"`
	// PeakRequestThroughput and PeakOutputThroughput are the highest
	// completed requests/s and output tokens/s of any level, and PeakAt
	// the rate of the level with the highest output throughput.
	PeakRequestThroughput float64 `json:"peak_request_throughput"`
	PeakOutputThroughput  float64 `json:"peak_output_throughput"`
	PeakAt                float64 `json:"peak_at_rate"`
}

// String is the capacity in a sentence, e.g. "goodput rate 0.43 req/s
// (interpolated between 0.4 and 0.6)".
func (c Capacity) String() string {
	var rate string
	switch c.Bound {
	case "none":
		rate = "goodput rate: no rate levels"
	case "below":
		rate = fmt.Sprintf("goodput rate < %.3g req/s (the lowest rate measured missed)", c.GoodputRate)
	case "at least":
		rate = fmt.Sprintf("goodput rate ≥ %.3g req/s (every rate measured met it)", c.GoodputRate)
	default:
		lo, hi := c.bracket()
		rate = fmt.Sprintf("goodput rate %.3g req/s (interpolated between %.3g and %.3g)", c.GoodputRate, lo, hi)
	}
	if c.NonMonotone {
		rate += ", attainment not monotone in the rate"
	}
	return fmt.Sprintf("%s; peak throughput %.2f req/s, %.1f output tok/s (at rate %.3g)",
		rate, c.PeakRequestThroughput, c.PeakOutputThroughput, c.PeakAt)
}

func (c Capacity) bracket() (lo, hi float64) {
	for i, pt := range c.Points {
		if pt.Attainment < c.Goal && i > 0 {
			return c.Points[i-1].Rate, pt.Rate
		}
	}
	return 0, 0
}

// Capacities summarizes each target of s over its rate levels (closed-loop
// levels count for throughput only). Goal is s.Plan.Goal, default
// DefaultGoal.
func Capacities(s *Suite) []Capacity {
	goal := DefaultGoal
	if s.Plan != nil && s.Plan.Goal > 0 {
		goal = s.Plan.Goal
	}
	var out []Capacity
	for _, t := range targetNames(s) {
		c := Capacity{Target: t, Goal: goal, Bound: "none"}
		for _, r := range s.Results {
			if r.Target != t {
				continue
			}
			if r.Report != nil {
				if r.RequestThroughput > c.PeakRequestThroughput {
					c.PeakRequestThroughput = r.RequestThroughput
				}
				if r.OutputThroughput > c.PeakOutputThroughput {
					c.PeakOutputThroughput, c.PeakAt = r.OutputThroughput, r.Load.Rate
				}
			}
			if r.Load.Rate > 0 {
				c.Points = append(c.Points, SearchPoint{Rate: r.Load.Rate, Attainment: r.Attained, Goodput: r.Goodput})
			}
		}
		slices.SortStableFunc(c.Points, func(a, b SearchPoint) int { return cmp.Compare(a.Rate, b.Rate) })
		c.GoodputRate, c.Bound, c.NonMonotone = GoodputRate(c.Points, goal)
		out = append(out, c)
	}
	return out
}

// GoodputRate reads the highest rate sustaining goal off measured points
// sorted by rate: linear interpolation between the last point at or above
// goal and the first below it. See Capacity.Bound for the bounds.
func GoodputRate(points []SearchPoint, goal float64) (rate float64, bound string, nonMonotone bool) {
	if len(points) == 0 {
		return 0, "none", false
	}
	miss := slices.IndexFunc(points, func(p SearchPoint) bool { return p.Attainment < goal })
	switch miss {
	case -1:
		return points[len(points)-1].Rate, "at least", false
	case 0:
		rate, bound = points[0].Rate, "below"
	default:
		a, b := points[miss-1], points[miss]
		rate, bound = a.Rate+(a.Attainment-goal)/(a.Attainment-b.Attainment)*(b.Rate-a.Rate), "interpolated"
	}
	for _, p := range points[miss+1:] {
		if p.Attainment >= goal {
			nonMonotone = true
		}
	}
	return rate, bound, nonMonotone
}

func targetNames(s *Suite) []string {
	var names []string
	if s.Plan != nil {
		for _, t := range s.Plan.Targets {
			names = append(names, t.Name)
		}
	}
	for _, r := range s.Results {
		if !slices.Contains(names, r.Target) {
			names = append(names, r.Target)
		}
	}
	return names
}
