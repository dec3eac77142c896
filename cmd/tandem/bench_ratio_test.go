package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// TestBenchExperimentRatioEndToEnd runs the ratio experiment in a short
// form: simulated engines at ten times real speed, a 1P+1D fit on a few
// chat requests, then every split of 4 engines (the predicted one, its
// neighbours) behind a tandem proxy process, a short rate search each. It
// checks what the report says, not only that it exists.
func TestBenchExperimentRatioEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 17 processes")
	}
	t.Setenv(actAsTandem, "1")
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // the embedded model is written here
	out := t.TempDir()
	start := time.Now()
	// A TTFT SLO above the longest prompt's prefill (1,024 tokens: 1.8 s
	// in the built-in profile), so that the splits meet the goal at some
	// rate and the searches end quickly.
	err := runBenchRatio([]string{"--out", out, "--engines", "4", "--sim-speed", "10", "--fit-requests", "12", "--fit-chat-rates", "1,2,4",
		"--min-requests", "8", "--level-seconds", "3", "--search-steps", "0", "--slo-chat-ttft", "4s", "--slo-chat-tpot", "200ms",
		"--engine-args", "--max-num-seqs 16"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("took %v", time.Since(start))
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	var sum experiment.RatioSummary
	readJSON(t, filepath.Join(out, "summary.json"), &sum)
	if len(sum.Workloads) != 1 || len(sum.Workloads[0].Checks) != 1 {
		t.Fatalf("summary.json: %+v, want one workload with one check", sum)
	}
	m, c := sum.Workloads[0].Model, sum.Workloads[0].Checks[0]
	if m.PrefillRate <= 0 || m.DecodeRate <= 0 || m.PrefillSource != "alone" || m.DecodeFit == "none" {
		t.Errorf("model %+v: want prefill legs alone and a decode rate", m)
	}
	// At --sim-speed 10 the model's wall-clock rates are ten times the
	// check's simulated ones.
	if got, want := c.Predicted.Goodput, m.BestSplit(4).Goodput/10; math.Abs(got-want) > 1e-9*want || c.Predicted.P != m.BestSplit(4).P {
		t.Errorf("check predicts %+v, the model %+v at speed 10", c.Predicted, m.BestSplit(4))
	}
	if c.N != 4 || len(c.Splits) != 3 || len(c.Curve) != 3 {
		t.Fatalf("check %+v: want the 3 splits of 4 engines and the model's curve", c)
	}
	for _, s := range c.Splits {
		if s.P+s.D != 4 || s.Predicted <= 0 || len(s.Points) < 2 || s.Bound == "" || !strings.Contains(s.Host, "proxy") {
			t.Errorf("split %+v: want a search of at least 2 rates and the host watched", s)
		}
	}
	if c.Verdict != "right" && c.Verdict != "tie" && c.Verdict != "wrong" && c.Verdict != "none met" {
		t.Errorf("verdict %q", c.Verdict)
	}
	for _, want := range []string{
		"--sim-speed 10", "fitting the model: 1 prefill + 1 decode simulated engine", "P:D ratio model", "prefill engine:", "decode engine:",
		"-- chat, N = 4: the model predicts", fmt.Sprintf("measuring %dP:%dD, ", c.Predicted.P, c.Predicted.D), "== the model against the measurement",
		fmt.Sprintf("%dP:%dD ◀ predicted", c.Predicted.P, c.Predicted.D), "cores", "proxy", "load ≤",
		fmt.Sprintf("chat N=4: predicted %dP:%dD", c.Predicted.P, c.Predicted.D), c.VerdictText(), "plot: ",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "FAILED") {
		t.Errorf("requests failed:\n%s", report)
	}
	if png, err := os.ReadFile(filepath.Join(out, "ratio.png")); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("ratio.png: %v", err)
	}
	// The engines were simulated ones, four per split.
	logs, _ := filepath.Glob(filepath.Join(out, "logs", "chat-n4-*-prefill-*.log"))
	if len(logs) != 1+2+3 {
		t.Errorf("prefill engine logs %v, want 1+2+3 over the three splits", logs)
	}
	for _, l := range logs {
		if b, _ := os.ReadFile(l); !strings.Contains(string(b), "simulated model") {
			t.Errorf("%s: not a simulated engine", l)
		}
	}
}
