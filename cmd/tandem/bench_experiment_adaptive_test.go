package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench/experiment"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestBenchExperimentAdaptive runs the adaptive configuration beside
// conditional on both workloads: it is started afresh for each workload
// (its own proxy and engines, both --role both), its planner decides
// against that workload's objectives, every request is answered, and the
// report and summary.json say where the planner stood.
func TestBenchExperimentAdaptive(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--configs", "conditional,adaptive",
		"--chat-rates", "8", "--long-rates", "4", "--requests", "6", "--rounds", "1", "--mnbt-sweep", "256", "--max-context", "256",
		"--slo-chat-ttft", "2s", "--slo-long-ttft", "7s", "--adaptive-proxy-args", "--plan-interval 100ms --plan-min-dwell 1s"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, want := range []string{"configurations: conditional, adaptive;", "adaptive: the planner at the end: 1P:1D, threshold ",
		"means over the adaptive configuration's requests", "goodput rate under each pair of objectives",
		"adaptive against the best static configuration per cell", "adaptive is at least 0.9× the best static configuration in "} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "FAILED") {
		t.Errorf("the report names failed requests:\n%s", report)
	}
	var sum experiment.PDSummary
	readJSON(t, filepath.Join(out, "summary.json"), &sum)
	if len(sum.Workloads) != 2 {
		t.Fatalf("summary.json has %d workloads, want chat and long", len(sum.Workloads))
	}
	for _, ws := range sum.Workloads {
		p := ws.Planner
		if p == nil {
			t.Errorf("%s: no planner state in summary.json", ws.Name)
			continue
		}
		if p.Prefill != 1 || p.Decode != 1 || p.Decisions["changed"]+p.Decisions["held"]+p.Decisions["steady"] == 0 {
			t.Errorf("%s: planner %+v, want 1P:1D and decisions made", ws.Name, *p)
		}
		if len(ws.Capacity) != 2 || ws.Capacity[1].Target != experiment.Adaptive || len(ws.Grid) != 25 {
			t.Errorf("%s: capacities %+v and %d grid cells, want conditional and adaptive in a 5×5 grid", ws.Name, ws.Capacity, len(ws.Grid))
		}
	}
	// One cluster per workload, its engines serving both roles and its
	// proxy planning against that workload's objectives.
	for _, c := range []struct{ wl, ttft string }{{"chat", "2s"}, {"long", "7s"}} {
		for _, e := range []string{"prefill-0", "decode-0"} {
			log, err := os.ReadFile(filepath.Join(out, "logs", "adaptive-"+c.wl+"-"+e+".log"))
			if err != nil {
				t.Errorf("no log of the %s workload's %s: %v", c.wl, e, err)
			} else if !strings.Contains(string(log), "role=both") {
				t.Errorf("the %s workload's %s does not serve both roles:\n%s", c.wl, e, log)
			}
		}
		if _, err := os.Stat(filepath.Join(out, "logs", "adaptive-"+c.wl+"-proxy.log")); err != nil {
			t.Errorf("no proxy log for the %s workload: %v", c.wl, err)
		}
	}
}
