package experiment

import (
	"fmt"
	"strings"

	"github.com/tandem-serve/tandem/internal/bench"
)

// rateText is a measured goodput rate as the reports print it: "-" without
// rate levels, "< FIRSTMISS" when even the lowest rate tried missed the
// goal, "≥ RATE" when every rate tried met it, else "RATE (DETAIL)".
func rateText(bound bench.Bound, rate, firstMiss float64, detail string) string {
	switch bound {
	case bench.BoundNone:
		return "-"
	case bench.BoundBelow:
		return fmt.Sprintf("< %.3g", firstMiss)
	case bench.BoundAtLeast:
		return fmt.Sprintf("≥ %.3g", rate)
	}
	return fmt.Sprintf("%.3g (%s)", rate, detail)
}

// boundNotes explain the one-sided bounds in the ratio experiment's lines.
var boundNotes = map[bench.Bound]string{
	bench.BoundBelow:   " (the lowest rate tried missed)",
	bench.BoundAtLeast: " (every rate tried met the goal)",
}

// measuredText is a split's measured goodput rate, e.g. "1.2 (1.5
// missed)", marked HOST-BOUND when the host was saturated.
func measuredText(pt bench.RatioPoint) string {
	s := rateText(pt.Bound, pt.Measured, pt.FirstMiss, fmt.Sprintf("%.3g missed", pt.FirstMiss)) + boundNotes[pt.Bound]
	if pt.HostBound {
		s += " HOST-BOUND"
	}
	return s
}

func splitList(ps []int, n int) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%dP:%dD", p, n-p))
	}
	return strings.Join(parts, ", ")
}

// scaleCheck multiplies every rate of c by f.
func scaleCheck(c bench.RatioCheck, f float64) bench.RatioCheck {
	c.Predicted.Goodput *= f
	c.PredictedMeasured *= f
	c.Curve = append([]bench.Split(nil), c.Curve...)
	for i := range c.Curve {
		c.Curve[i].Goodput *= f
	}
	c.Splits = append([]bench.RatioPoint(nil), c.Splits...)
	for i := range c.Splits {
		c.Splits[i] = scalePoint(c.Splits[i], f)
	}
	c.Best = scalePoint(c.Best, f)
	return c
}

// scalePoint is s with every rate multiplied by f.
func scalePoint(s bench.RatioPoint, f float64) bench.RatioPoint {
	s.Predicted *= f
	s.Measured *= f
	s.FirstMiss *= f
	s.Points = append([]bench.SearchPoint(nil), s.Points...)
	for i := range s.Points {
		p := &s.Points[i]
		p.Rate *= f
		p.Goodput *= f
		p.RequestThroughput *= f
		p.OutputThroughput *= f
	}
	return s
}
