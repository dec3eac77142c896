package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/experiment"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestBenchExperimentPhased runs `tandem bench experiment pd --engines 3`
// on simulated engines: every configuration has three engines and the
// tuned chunk budget (colocated behind a proxy with no prefill pool, pd at
// 1:2, adaptive --role both once per cell of its grid, each planning for
// that cell's objectives), one after the other after the same warm-up;
// every request is answered; the report compares each adaptive cell with
// the static configurations and lists the planner's decisions.
func TestBenchExperimentPhased(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 16 processes")
	}
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	start := time.Now()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--engines", "3", "--splits", "1:2",
		"--configs", "colocated,pd,adaptive", "--workloads", "chat", "--chat-rates", "20", "--requests", "6", "--rounds", "1",
		"--warmup", "4", "--mnbt-sweep", "64", "--max-context", "256", "--slo-chat-ttft", "2s", "--slo-chat-tpot", "200ms",
		"--adaptive-ttft-scales", "1,2", "--engine-args", "--simulate --sim-speed 20", "--progress", "0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("took %v", time.Since(start))
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, want := range []string{"3 engines each (pd and conditional at the splits 1:2)", "every engine of every configuration: --max-num-batched-tokens 64",
		"warm-up: every configuration is sent 4 requests at 20 req/s", "adaptive: one run per cell, TTFT × 1, 2 by TPOT × 1",
		"adaptive-ttft2-tpot1 (TTFT ≤ 4s, TPOT ≤ 200ms): goodput rate", "planner: ", " decisions (times from the first measured request)",
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
	if sum.Engines != 3 || sum.MNBT != 64 || len(sum.Workloads) != 1 {
		t.Fatalf("summary.json: %d engines, chunk budget %d, %d workloads; want 3, 64, 1", sum.Engines, sum.MNBT, len(sum.Workloads))
	}
	ws := sum.Workloads[0]
	var targets []string
	for _, c := range ws.Capacity {
		targets = append(targets, c.Target)
	}
	if want := []string{"colocated", "pd-1p2d", experiment.Adaptive}; !slices.Equal(targets, want) {
		t.Errorf("capacities of %q, want %q", targets, want)
	}
	if len(ws.AdaptiveRuns) != 2 || len(ws.Adaptive) != 2 || ws.Planner == nil {
		t.Fatalf("%d adaptive runs, %d compared cells, planner %v; want 2, 2 and the ×1 run's planner", len(ws.AdaptiveRuns), len(ws.Adaptive), ws.Planner)
	}
	for i, run := range ws.AdaptiveRuns {
		ttft := []time.Duration{2 * time.Second, 4 * time.Second}[i]
		if run.SLO.TTFT != ttft || run.SLO.TPOT != 200*time.Millisecond || len(run.Steps) == 0 || run.Planner == nil {
			t.Errorf("adaptive run %d: objectives %v/%v, %d plan steps; want %v/200ms and its decisions", i, run.SLO.TTFT, run.SLO.TPOT, len(run.Steps), ttft)
		}
		if c := ws.Adaptive[i]; c.TTFTScale != run.TTFTScale || c.TPOTScale != 1 {
			t.Errorf("compared cell %d is %g×%g, want the run's %g×1", i, c.TTFTScale, c.TPOTScale, run.TTFTScale)
		}
	}
	// The colocated configuration and each adaptive run's start: three
	// engines behind a proxy given them as decodes only (--decode alone),
	// no prefill engine.
	for _, name := range []string{"colocated", "adaptive", "adaptive-ttft2-tpot1"} {
		for _, e := range []string{"decode-0", "decode-1", "decode-2"} {
			if _, err := os.Stat(filepath.Join(out, "logs", "chat-"+name+"-"+e+".log")); err != nil {
				t.Errorf("no log of %s's %s: %v", name, e, err)
			}
		}
		if _, err := os.Stat(filepath.Join(out, "logs", "chat-"+name+"-prefill-0.log")); err == nil {
			t.Errorf("%s started a prefill engine, want the colocated split", name)
		}
	}
	// The planner of each adaptive run has its cell's objectives.
	for _, c := range []struct{ name, ttft string }{{"adaptive", "2s"}, {"adaptive-ttft2-tpot1", "4s"}} {
		plan := readPlanObjectives(t, filepath.Join(out, "results-chat-"+c.name+".json"))
		if plan != c.ttft {
			t.Errorf("%s scored against TTFT %s, want %s", c.name, plan, c.ttft)
		}
	}
}

// readPlanObjectives is the TTFT objective a results file was scored
// against.
func readPlanObjectives(t *testing.T, path string) string {
	t.Helper()
	var s struct {
		Plan struct {
			SLO struct {
				TTFT time.Duration `json:"ttft_ns"`
			} `json:"slo"`
		} `json:"plan"`
	}
	readJSON(t, path, &s)
	return s.Plan.SLO.TTFT.String()
}
