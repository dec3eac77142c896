package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
		name         string
		points       []SearchPoint
		rate, interp float64
		bound        Bound
		nonMonotone  bool
	}{
		// 1.0 at 100%, 2.0 at 80%: 1.0 is the highest that met; 90% is half way, 1.5 req/s.
		{"between two tested rates", pts(1, 1, 2, 0.8), 1, 1.5, "between", false},
		// 0.2 at 95%, 0.4 at 92%, 0.6 at 62%: (0.92-0.9)/(0.92-0.62) = 1/15 of 0.2 past 0.4.
		{"the last rate that met it, before the first miss", pts(0.2, 0.95, 0.4, 0.92, 0.6, 0.62), 0.4, 0.4 + 0.2/15, "between", false},
		{"exactly at the goal is met", pts(1, 0.9, 2, 0.5), 1, 1, "between", false},
		{"every rate met it", pts(1, 1, 2, 0.95), 2, 2, "at least", false},
		{"even the lowest missed", pts(1, 0.5, 2, 0.2), 0, 1, "below", false},
		{"a recovery above the first miss is flagged, not believed", pts(1, 1, 2, 0.7, 3, 0.95), 1, 1 + 0.1/0.3, "between", true},
		{"no points", nil, 0, 0, "none", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rate, interp, bound, nm := GoodputRate(tc.points, 0.9)
			if rate != tc.rate || math.Abs(interp-tc.interp) > 1e-12 || bound != tc.bound || nm != tc.nonMonotone {
				t.Errorf("GoodputRate = %v %v %q %v, want %v %v %q %v", rate, interp, bound, nm, tc.rate, tc.interp, tc.bound, tc.nonMonotone)
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
	// pd: 100% at 0.4, 50% at 0.6 → 0.4 measured, 0.4 + 0.2·(0.1/0.5) = 0.44 interpolated.
	if c := cs[0]; c.GoodputRate != 0.4 || c.FirstMiss != 0.6 || math.Abs(c.Interpolated-0.44) > 1e-12 || c.Bound != "between" || c.PeakRequestThroughput != 0.45 || c.PeakOutputThroughput != 90 || c.PeakAt != 0.6 || c.Goal != DefaultGoal {
		t.Errorf("pd: %+v", c)
	}
	wantPoints := []SearchPoint{
		{Rate: 0.2, Attainment: 1, RequestThroughput: 0.2, OutputThroughput: 40},
		{Rate: 0.4, Attainment: 1, RequestThroughput: 0.4, OutputThroughput: 80},
		{Rate: 0.6, Attainment: 0.5, RequestThroughput: 0.45, OutputThroughput: 90},
	}
	if diff := cmp.Diff(wantPoints, cs[0].Points); diff != "" {
		t.Errorf("pd's per-level points (-want +got):\n%s", diff)
	}
	// colocated: 95% at 0.2, 70% at 0.4 → 0.2 measured, 0.2 + 0.2·(0.05/0.25) = 0.24 interpolated.
	if c := cs[1]; c.GoodputRate != 0.2 || math.Abs(c.Interpolated-0.24) > 1e-12 || c.PeakOutputThroughput != 110 {
		t.Errorf("colocated: %+v", c)
	}
	if got := cs[0].String(); !strings.Contains(got, "goodput rate 0.4 req/s (the highest tested rate meeting 90%; 0.6 missed; linear estimate 0.44)") || !strings.Contains(got, "peak throughput 0.45 req/s, 90.0 output tok/s") {
		t.Errorf("String = %q", got)
	}
	if got, want := cs[0].Levels(), "0.2: 0.20 req/s 40 tok/s 100%; 0.4: 0.40 req/s 80 tok/s 100%; 0.6: 0.45 req/s 90 tok/s 50%"; got != want {
		t.Errorf("Levels = %q, want %q", got, want)
	}
}

// TestThroughputAndGoodputOfALevelByHand: a level of 4 requests over 2 s,
// one failed, with known lengths and latencies.
func TestThroughputAndGoodputOfALevelByHand(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		{TTFT: 100 * ms, E2E: 1000 * ms, PromptTokens: 100, OutputTokens: 10}, // TPOT 100 ms: meets
		{TTFT: 200 * ms, E2E: 500 * ms, PromptTokens: 50, OutputTokens: 4},    // TPOT 100 ms: meets
		{TTFT: 900 * ms, E2E: 1200 * ms, PromptTokens: 30, OutputTokens: 4},   // TTFT misses
		{TTFT: 10 * ms, E2E: 20 * ms, PromptTokens: 7, Err: "HTTP 503"},       // a failure: a miss, no throughput
	}
	r := &Result{Target: "pd", Load: Load{Rate: 2}, Records: recs}
	r.summarize(&Plan{Model: "m", SLO: SLO{TTFT: 500 * ms, TPOT: 100 * ms}}, 2*time.Second)
	// 3 completed in 2 s: 1.5 req/s; 18 output tokens: 9 tok/s; 180 prompt +
	// 18 output = 198 tokens: 99 tok/s; 2 met: 50%, 1 req/s.
	if r.RequestThroughput != 1.5 || r.OutputThroughput != 9 || r.TotalThroughput != 99 || r.Attained != 0.5 || r.Goodput != 1 {
		t.Errorf("req/s %v, out tok/s %v, total tok/s %v, attained %v, goodput %v; want 1.5, 9, 99, 0.5, 1",
			r.RequestThroughput, r.OutputThroughput, r.TotalThroughput, r.Attained, r.Goodput)
	}
	s := &Suite{Plan: &Plan{Targets: []Target{{Name: "pd"}}}, Results: []*Result{r}}
	if c := Capacities(s)[0]; c.Bound != "below" || c.GoodputRate != 0 || c.FirstMiss != 2 || c.Points[0] != (SearchPoint{Rate: 2, Attainment: 0.5, Goodput: 1, RequestThroughput: 1.5, OutputThroughput: 9}) {
		t.Errorf("capacity %+v", c)
	}
}

func TestSearchSuiteTakesTheSearchsAnswer(t *testing.T) {
	res := func(rate, attained float64) *Result {
		return &Result{Target: "a", Load: Load{Rate: rate}, Attained: attained, Report: &Report{RequestThroughput: rate}}
	}
	// Tried in search order: 1 (met), 2 (met), 4 (missed), 3 (met).
	sr := SearchResult{Target: "a", MaxRate: 3, FirstMiss: 4, Results: []*Result{res(1, 1), res(2, 0.95), res(4, 0.5), res(3, 0.92)}}
	s := SearchSuite(&Plan{Targets: []Target{{Name: "a"}}}, 0.9, []SearchResult{sr})
	if len(s.Results) != 4 || s.Results[2].Load.Rate != 3 || len(s.Search) != 1 {
		t.Fatalf("results not in rate order: %+v", s.Results)
	}
	c := s.Capacity[0]
	if c.GoodputRate != 3 || c.FirstMiss != 4 || c.Bound != "search" || c.PeakRequestThroughput != 4 || len(c.Points) != 4 {
		t.Errorf("capacity %+v", c)
	}
	if !strings.Contains(c.String(), "goodput rate 3 req/s (rate search for 90%; 4 missed)") {
		t.Errorf("String = %q", c.String())
	}
}
