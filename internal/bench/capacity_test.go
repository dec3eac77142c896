package bench

import (
	"math"
	"strings"
	"testing"
)

func TestGoodputRateByHand(t *testing.T) {
	pts := func(ra ...float64) []SearchPoint {
		var out []SearchPoint
		for i := 0; i < len(ra); i += 2 {
			out = append(out, SearchPoint{Rate: ra[i], Attainment: ra[i+1]})
		}
		return out
	}
	tests := []struct {
		name        string
		points      []SearchPoint
		want        float64
		bound       string
		nonMonotone bool
	}{
		// 1.0 at 100%, 2.0 at 80%: 90% is half way, 1.5 req/s.
		{"interpolated half way", pts(1, 1, 2, 0.8), 1.5, "interpolated", false},
		// 0.2 at 95%, 0.4 at 92%, 0.6 at 62%: (0.92-0.9)/(0.92-0.62) = 1/15 of 0.2 past 0.4.
		{"interpolated from the last rate that met it", pts(0.2, 0.95, 0.4, 0.92, 0.6, 0.62), 0.4 + 0.2/15, "interpolated", false},
		{"exactly at the goal is met", pts(1, 0.9, 2, 0.5), 1 + 0/0.4, "interpolated", false},
		{"every rate met it", pts(1, 1, 2, 0.95), 2, "at least", false},
		{"even the lowest missed", pts(1, 0.5, 2, 0.2), 1, "below", false},
		{"a recovery above the first miss is flagged, not believed", pts(1, 1, 2, 0.7, 3, 0.95), 1 + 0.1/0.3, "interpolated", true},
		{"no points", nil, 0, "none", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, bound, nm := GoodputRate(tc.points, 0.9)
			if math.Abs(got-tc.want) > 1e-12 || bound != tc.bound || nm != tc.nonMonotone {
				t.Errorf("GoodputRate = %v %q %v, want %v %q %v", got, bound, nm, tc.want, tc.bound, tc.nonMonotone)
			}
		})
	}
}

func TestCapacitiesPerTarget(t *testing.T) {
	res := func(target string, rate, attained, reqs, toks float64) *Result {
		return &Result{Target: target, Load: Load{Rate: rate}, Attained: attained,
			Report: &Report{RequestThroughput: reqs, OutputThroughput: toks}}
	}
	s := &Suite{
		Plan: &Plan{Targets: []Target{{Name: "pd"}, {Name: "colocated"}}},
		// Out of rate order on purpose: the summary sorts.
		Results: []*Result{
			res("pd", 0.6, 0.5, 0.45, 90), res("colocated", 0.6, 0.25, 0.5, 110),
			res("pd", 0.2, 1, 0.2, 40), res("colocated", 0.2, 0.95, 0.2, 41),
			res("pd", 0.4, 1, 0.4, 80), res("colocated", 0.4, 0.7, 0.39, 79),
		},
	}
	cs := Capacities(s)
	if len(cs) != 2 || cs[0].Target != "pd" || cs[1].Target != "colocated" {
		t.Fatalf("capacities %+v", cs)
	}
	// pd: 100% at 0.4, 50% at 0.6 → 0.4 + 0.2·(0.1/0.5) = 0.44.
	if c := cs[0]; math.Abs(c.GoodputRate-0.44) > 1e-12 || c.Bound != "interpolated" || c.PeakRequestThroughput != 0.45 || c.PeakOutputThroughput != 90 || c.PeakAt != 0.6 || c.Goal != DefaultGoal {
		t.Errorf("pd: %+v", c)
	}
	// colocated: 95% at 0.2, 70% at 0.4 → 0.2 + 0.2·(0.05/0.25) = 0.24.
	if c := cs[1]; math.Abs(c.GoodputRate-0.24) > 1e-12 || c.PeakOutputThroughput != 110 {
		t.Errorf("colocated: %+v", c)
	}
	if got := cs[0].String(); !strings.Contains(got, "goodput rate 0.44 req/s (interpolated between 0.4 and 0.6)") || !strings.Contains(got, "peak throughput 0.45 req/s, 90.0 output tok/s") {
		t.Errorf("String = %q", got)
	}
}
