package experiment

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
)

// TestAdaptiveProxyArgs: the adaptive proxy runs the router's defaults
// with the planner acting on the workload's own objectives and the
// experiment's goal, the user's extra flags last (a later flag wins).
func TestAdaptiveProxyArgs(t *testing.T) {
	r := &pdRun{experiment: &experiment{procs: &procs{}, model: "/m/tiny", goal: 0.8},
		cfg: PD{Threshold: 128, AdaptiveArgs: []string{"--plan-min-dwell", "5s"}}}
	got := r.adaptiveProxyArgs(Workload{Name: "long", SLO: bench.SLO{TTFT: 5 * time.Second, TPOT: 100 * time.Millisecond}})
	want := []string{"--policy", "prefix", "--pd-decider", "conditional", "--pd-threshold", "128", "--model", "/m/tiny",
		"--slo-ttft", "5s", "--slo-tpot", "100ms", "--planner-act", "--plan-max-num-seqs", "64", "--slo-goal", "0.8", "--plan-min-dwell", "5s"}
	if !slices.Equal(got, want) {
		t.Errorf("adaptiveProxyArgs = %q\nwant %q", got, want)
	}
	// A goal of 1 is the experiment's, not the planner's (it wants < 1).
	r.goal = 1
	if got := r.adaptiveProxyArgs(Workload{SLO: bench.SLO{TTFT: time.Second, TPOT: time.Second}}); slices.Contains(got, "--slo-goal") {
		t.Errorf("goal 1 passed to the planner: %q", got)
	}
}

// TestParsePlanner reads the planner's gauges and counters from a
// Prometheus text page and says when a page has none.
func TestParsePlanner(t *testing.T) {
	page := `# HELP tandem:planner_desired_replicas ...
tandem:planner_desired_replicas{role="decode"} 3
tandem:planner_desired_replicas{role="prefill"} 1
tandem:planner_threshold_tokens 1068
tandem:planner_prefill_schedule_interval 4
tandem:planner_predicted_goodput_rps 2.5
tandem:planner_decisions_total{result="changed"} 2
tandem:planner_decisions_total{result="held"} 7
tandem:planner_role_switches_total{to="decode"} 2
tandem:proxy_requests_total 9
`
	p, ok := parsePlanner(strings.NewReader(page))
	if !ok || p.Prefill != 1 || p.Decode != 3 || p.Threshold != 1068 || p.Interval != 4 || p.Goodput != 2.5 ||
		p.Decisions["changed"] != 2 || p.Decisions["held"] != 7 || p.Switches["decode"] != 2 {
		t.Errorf("parsePlanner = %+v, %v", p, ok)
	}
	if _, ok := parsePlanner(strings.NewReader("tandem:proxy_requests_total 9\n")); ok {
		t.Error("a page without the planner's metrics parsed as a planner state")
	}
}

// TestAdaptiveCells compares adaptive with the best static configuration
// per grid cell: the ratio of the estimates, a win, a cell no
// configuration met, one only adaptive missed, and a tie of the static
// configurations named together; the report counts them.
func TestAdaptiveCells(t *testing.T) {
	capOf := func(target string, bound bench.Bound, rate float64) bench.Capacity {
		return bench.Capacity{Target: target, Bound: bound, Interpolated: rate}
	}
	grid := []bench.GridCell{
		{TTFTScale: 1, TPOTScale: 1, Capacities: []bench.Capacity{capOf("pd", "between", 2), capOf("conditional", "between", 4), capOf(Adaptive, "between", 3.8)}},
		{TTFTScale: 1, TPOTScale: 2, Capacities: []bench.Capacity{capOf("pd", "between", 2), capOf("conditional", "between", 2), capOf(Adaptive, "at least", 4)}},
		{TTFTScale: 2, TPOTScale: 1, Capacities: []bench.Capacity{capOf("pd", "below", 1), capOf("conditional", "below", 1), capOf(Adaptive, "below", 1)}},
		{TTFTScale: 2, TPOTScale: 2, Capacities: []bench.Capacity{capOf("pd", "between", 1.5), capOf("conditional", "below", 1), capOf(Adaptive, "below", 1)}},
		{TTFTScale: 4, TPOTScale: 1, Capacities: []bench.Capacity{capOf("pd", "at least", 8), capOf(Adaptive, "between", 6)}},
		{TTFTScale: 4, TPOTScale: 2, Capacities: []bench.Capacity{capOf("pd", "at least", 8), capOf(Adaptive, "at least", 8)}},
	}
	cells := adaptiveCells(grid)
	if len(cells) != 6 {
		t.Fatalf("%d cells, want 6", len(cells))
	}
	if c := cells[0]; c.BestStatic != 4 || !slices.Equal(c.Static, []string{"conditional"}) || c.Ratio < 0.949 || c.Ratio > 0.951 || c.AdaptiveAtLeast || c.StaticAtLeast {
		t.Errorf("cell 0: %+v, want conditional best at 4, ratio 0.95", c)
	}
	if c := cells[1]; c.BestStatic != 2 || !slices.Equal(c.Static, []string{"pd", "conditional"}) || c.Ratio != 2 || !c.AdaptiveAtLeast || c.StaticAtLeast {
		t.Errorf("cell 1: %+v, want pd and conditional tied at 2, ratio 2, a lower bound", c)
	}
	if c := cells[2]; c.BestStatic != 0 || c.Adaptive != 0 || c.Ratio != 0 || c.Static != nil {
		t.Errorf("cell 2: %+v, want nothing met", c)
	}
	if c := cells[3]; c.BestStatic != 1.5 || c.Adaptive != 0 || c.Ratio != 0 {
		t.Errorf("cell 3: %+v, want only adaptive missing", c)
	}
	var b strings.Builder
	writeAdaptiveCells(&b, cells, "")
	for _, want := range []string{"0.95", "≥2.00*", "none", "0.00", "≤0.75", "top", "in 3 of the 5 cells some static configuration met, and above every static one in 1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if adaptiveCells(grid[:1][:1]) == nil || adaptiveCells([]bench.GridCell{{Capacities: []bench.Capacity{capOf("pd", "between", 1)}}}) != nil {
		t.Error("a grid without the adaptive configuration compared")
	}
}
