package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// DefaultGoal is the fraction of requests that must meet the SLO for a rate
// to count as sustained: DistServe's 90%.
const DefaultGoal = 0.9

// Bound says where a measured goodput rate's true value lies, relative to
// the rates tried (Capacity.GoodputRate and FirstMiss).
type Bound string

const (
	// BoundBetween: in [GoodputRate, FirstMiss).
	BoundBetween Bound = "between"
	// BoundAtLeast: every rate met the goal; the true one is GoodputRate
	// or higher.
	BoundAtLeast Bound = "at least"
	// BoundBelow: even the lowest rate, FirstMiss, missed the goal.
	BoundBelow Bound = "below"
	// BoundSearch: a rate search's bisection bracketed it in
	// [GoodputRate, FirstMiss).
	BoundSearch Bound = "search"
	// BoundNone: no rate levels (closed loops only).
	BoundNone Bound = "none"
)

// Capacity is what one target sustained over a run's arrival rates: its
// goodput rate (the highest rate at which Goal of the requests met the SLO)
// and the throughput of every level.
type Capacity struct {
	Target string  `json:"target"`
	Goal   float64 `json:"goal"`
	// GoodputRate is the highest tested arrival rate (requests/s) at which
	// at least Goal of the requests met the SLO, below the first rate that
	// missed (a rate search's answer, with Bound "search"); 0 when even the
	// lowest rate missed.
	GoodputRate float64 `json:"goodput_rate"`
	// Interpolated is a finer estimate between the tested rates: linear in
	// the attainment between GoodputRate and the first rate that missed.
	// It equals GoodputRate when no rate missed, and is the lowest rate
	// when even that one missed.
	Interpolated float64 `json:"goodput_rate_interpolated"`
	// Bound says where the true goodput rate lies.
	Bound Bound `json:"bound"`
	// FirstMiss is the lowest tested rate that missed the goal, 0 if none.
	FirstMiss float64 `json:"first_miss,omitempty"`
	// NonMonotone says that a rate above the first miss met the goal again
	// (noise, or a quieter moment of the host): the estimate takes the first
	// miss.
	NonMonotone bool `json:"non_monotone,omitempty"`
	// Points are the measured levels in rate order: attainment, goodput
	// and throughput at each.
	Points []SearchPoint `json:"points"`
	// PeakRequestThroughput and PeakOutputThroughput are the highest
	// completed requests/s and output tokens/s of any level, and PeakAt
	// the rate of the level with the highest output throughput.
	PeakRequestThroughput float64 `json:"peak_request_throughput"`
	PeakOutputThroughput  float64 `json:"peak_output_throughput"`
	PeakAt                float64 `json:"peak_at_rate"`
}

// String is the capacity in a sentence, e.g. "goodput rate 0.4 req/s (the
// highest tested rate meeting 90%; 0.6 missed; linear estimate 0.44)".
func (c Capacity) String() string {
	goal := fmt.Sprintf("%.0f%%", 100*c.Goal)
	var rate string
	switch c.Bound {
	case BoundNone:
		rate = "goodput rate: no rate levels"
	case BoundBelow:
		rate = fmt.Sprintf("goodput rate < %.3g req/s (the lowest tested rate missed %s)", c.FirstMiss, goal)
	case BoundAtLeast:
		rate = fmt.Sprintf("goodput rate ≥ %.3g req/s (every tested rate met %s)", c.GoodputRate, goal)
	case BoundSearch:
		rate = fmt.Sprintf("goodput rate %.3g req/s (rate search for %s; %.3g missed)", c.GoodputRate, goal, c.FirstMiss)
	default:
		rate = fmt.Sprintf("goodput rate %.3g req/s (the highest tested rate meeting %s; %.3g missed; linear estimate %.3g)", c.GoodputRate, goal, c.FirstMiss, c.Interpolated)
	}
	if c.NonMonotone {
		rate += ", attainment not monotone in the rate"
	}
	return fmt.Sprintf("%s; peak throughput %.2f req/s, %.1f output tok/s (at rate %.3g)",
		rate, c.PeakRequestThroughput, c.PeakOutputThroughput, c.PeakAt)
}

// Levels describes the throughput at each rate, e.g. "0.2: 0.19 req/s
// 41 tok/s 100%; 0.4: ...".
func (c Capacity) Levels() string {
	parts := make([]string, len(c.Points))
	for i, p := range c.Points {
		parts[i] = fmt.Sprintf("%g: %.2f req/s %.0f tok/s %.0f%%", p.Rate, p.RequestThroughput, p.OutputThroughput, 100*p.Attainment)
	}
	return strings.Join(parts, "; ")
}

// Capacities summarizes each target of s over its rate levels (closed-loop
// levels count for throughput only). Goal is s.Plan.Goal, default
// DefaultGoal.
func Capacities(s *Suite) []Capacity {
	goal := DefaultGoal
	if s.Plan != nil && s.Plan.Goal > 0 {
		goal = s.Plan.Goal
	}
	return capacities(s, goal)
}

func capacities(s *Suite, goal float64) []Capacity {
	var out []Capacity
	for _, t := range targetNames(s) {
		c := Capacity{Target: t, Goal: goal}
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
				c.Points = append(c.Points, r.point())
			}
		}
		slices.SortStableFunc(c.Points, func(a, b SearchPoint) int { return cmp.Compare(a.Rate, b.Rate) })
		c.fill(c.Points, goal)
		out = append(out, c)
	}
	return out
}

// point is r's level as a SearchPoint.
func (r *Result) point() SearchPoint {
	p := SearchPoint{Rate: r.Load.Rate, Attainment: r.Attained, Goodput: r.Goodput}
	if r.Report != nil {
		p.RequestThroughput, p.OutputThroughput = r.RequestThroughput, r.OutputThroughput
	}
	return p
}

// fill sets the goodput rate fields from points sorted by rate.
func (c *Capacity) fill(points []SearchPoint, goal float64) {
	c.Bound = BoundNone
	if len(points) == 0 {
		return
	}
	miss := slices.IndexFunc(points, func(p SearchPoint) bool { return p.Attainment < goal })
	switch miss {
	case -1:
		last := points[len(points)-1].Rate
		c.GoodputRate, c.Interpolated, c.Bound = last, last, BoundAtLeast
	case 0:
		c.Interpolated, c.FirstMiss, c.Bound = points[0].Rate, points[0].Rate, BoundBelow
	default:
		a, b := points[miss-1], points[miss]
		c.GoodputRate, c.FirstMiss, c.Bound = a.Rate, b.Rate, BoundBetween
		c.Interpolated = a.Rate + (a.Attainment-goal)/(a.Attainment-b.Attainment)*(b.Rate-a.Rate)
	}
	if miss >= 0 {
		c.NonMonotone = slices.ContainsFunc(points[miss+1:], func(p SearchPoint) bool { return p.Attainment >= goal })
	}
}

// GoodputRate reads the goodput rate off measured points sorted by rate:
// the highest rate meeting goal below the first that misses, and the
// linear estimate between the two. See Capacity.Bound for the bounds.
func GoodputRate(points []SearchPoint, goal float64) (rate, interpolated float64, bound Bound, nonMonotone bool) {
	var c Capacity
	c.fill(points, goal)
	return c.GoodputRate, c.Interpolated, c.Bound, c.NonMonotone
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
