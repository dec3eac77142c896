package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// TestBenchExperimentRatioEndToEnd runs the ratio experiment in a short
// form: simulated engines at ten times real speed, a 1P+1D fit on a few
// chat requests, then every split of 4 engines (the predicted one, its
// neighbours) behind a tandem proxy process, a short rate search each. It
// checks what the report says, not only that it exists, and recomputes the
// model, the predictions and the verdict from the numbers the run reports
// (checkRatioByHand): whether the prediction comes true on a loaded 2-core
// machine is noise, but a check that disagrees with its own inputs is a bug.
func TestBenchExperimentRatioEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 17 processes")
	}
	t.Setenv(actAsTandem, "1")
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // the embedded model is written here
	out := t.TempDir()
	start := time.Now()
	// A TTFT SLO well above the longest prompt's prefill (1,024 tokens:
	// 1.8 s in the built-in profile), so that the splits meet the goal at
	// some rate and the searches end quickly. At ten times real speed a
	// fit prompt has (SLO - 1.8 s)/10 of real time to spare: with a 4 s
	// SLO that was 0.22 s, and one prompt of the 9 held up that long by a
	// busy machine was more than the 5% the goal lets miss, so the model
	// called the workload unattainable and there was nothing to check.
	// 10 s leaves 0.82 s.
	//
	// The proxies' hung-engine deadlines and the prefills' KV lease are
	// raised to the requests' own limit (the bench's --timeout, 10m): on
	// a loaded machine an engine starved of CPU for 30 s (the default
	// --stall-timeout, and --kv-lease) had its streams cut or its KV
	// freed, and the run failed on requests that were only slow.
	stdout, stderr, err := captureOutput(t, func() error {
		return runBenchRatio([]string{"--out", out, "--engines", "4", "--sim-speed", "10", "--fit-requests", "12", "--fit-chat-rates", "1,2,4",
			"--min-requests", "8", "--level-seconds", "3", "--search-steps", "0", "--slo-chat-ttft", "10s", "--slo-chat-tpot", "200ms",
			"--engine-args", "--max-num-seqs 16 --kv-lease 10m", "--proxy-args", "--timeout 10m --first-byte-timeout 10m --stall-timeout 10m"})
	})
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	checkPlain(t, stdout, stderr, levelLine)
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
	checkRatioByHand(t, m, c, 0.6, sum.Goal)
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

// checkRatioByHand recomputes, from the numbers a ratio run reports, what a
// wrong model or a wrong check would get wrong. Whether the model's
// prediction comes true on a loaded 2-core machine is noise; these follow
// from the reported inputs and measurements whatever the noise:
//   - the model's rates from its fitted inputs: a prefill engine serves
//     ρ*/s̄ req/s, a decode engine k*/((mean output − 1)·TPOT(k*));
//   - every split's prediction: min(P · the prefill rate per engine at P,
//     D · the decode rate), ÷ 10 for simulated req/s (the per-engine
//     prefill rate is reported at P = 1, 2, 4, …: at P = 3 it lies between
//     those at 2 and 4), and the predicted split the best of the curve;
//   - every split's rate search: it starts at searchFrom × the split's
//     prediction, its measured rate is the highest rate met below its
//     first miss, and the first miss the lowest rate missed;
//   - the verdict and the measured best from the measured rates.
func checkRatioByHand(t *testing.T, m bench.PDModel, c bench.RatioCheck, searchFrom, goal float64) {
	t.Helper()
	const speed = 10
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want)) }
	if !near(m.PrefillRate, m.PrefillBusy/m.PrefillSeconds) {
		t.Errorf("prefill rate %v, want ρ* %v / s̄ %v", m.PrefillRate, m.PrefillBusy, m.PrefillSeconds)
	}
	if m.DecodeFit == "fit" {
		if want := m.DecodeBatch / ((m.MeanOutput - 1) * m.DecodeTPOT / 1000); !near(m.DecodeRate, want) {
			t.Errorf("decode rate %v, want k* %v / ((%v − 1) · %v ms) = %v", m.DecodeRate, m.DecodeBatch, m.MeanOutput, m.DecodeTPOT, want)
		}
		if !near(m.DecodeTPOT, m.StepA+m.StepB*m.DecodeBatch) {
			t.Errorf("TPOT at k* %v, want %v + %v·%v", m.DecodeTPOT, m.StepA, m.StepB, m.DecodeBatch)
		}
	}
	// prefillAt bounds the per-engine prefill rate at p by the reported
	// rates at the powers of two around it.
	prefillAt := func(p int) (lo, hi float64) {
		for q := p; q >= 1; q-- {
			if r, ok := m.PrefillRates[q]; ok {
				lo = r
				break
			}
		}
		for q := p; q <= 2*p; q++ {
			if r, ok := m.PrefillRates[q]; ok {
				hi = r
				break
			}
		}
		return lo, hi
	}
	predict := func(p, d int) (lo, hi float64) {
		plo, phi := prefillAt(p)
		dec := float64(d) * m.DecodeRate
		return math.Min(float64(p)*plo, dec) / speed, math.Min(float64(p)*phi, dec) / speed
	}
	within := func(x, lo, hi float64) bool { return x >= lo*(1-1e-9) && x <= hi*(1+1e-9) }
	best := c.Curve[0]
	for _, sp := range c.Curve {
		if lo, hi := predict(sp.P, sp.D); !within(sp.Goodput, lo, hi) {
			t.Errorf("the model's curve at %dP:%dD: %v req/s, want min(P·prefill, D·decode)/10 in [%v, %v]", sp.P, sp.D, sp.Goodput, lo, hi)
		}
		if sp.Goodput > best.Goodput {
			best = sp
		}
	}
	if c.Predicted.P != best.P || !near(c.Predicted.Goodput, best.Goodput) {
		t.Errorf("predicted %+v, want the curve's best %+v", c.Predicted, best)
	}
	bestMeasured := c.Splits[0]
	var predicted *bench.RatioPoint
	for i, s := range c.Splits {
		if lo, hi := predict(s.P, s.D); !within(s.Predicted, lo, hi) {
			t.Errorf("%dP:%dD predicted %v req/s, want min(P·prefill, D·decode)/10 in [%v, %v]", s.P, s.D, s.Predicted, lo, hi)
		}
		if len(s.Points) == 0 || !near(s.Points[0].Rate, searchFrom*s.Predicted) {
			t.Errorf("%dP:%dD: the search started at %+v, want %v × the prediction %v", s.P, s.D, s.Points, searchFrom, s.Predicted)
		}
		var firstMiss float64
		for _, pt := range s.Points {
			if pt.Attainment < goal && (firstMiss == 0 || pt.Rate < firstMiss) {
				firstMiss = pt.Rate
			}
		}
		var measured float64
		for _, pt := range s.Points {
			if pt.Attainment >= goal && (firstMiss == 0 || pt.Rate < firstMiss) {
				measured = math.Max(measured, pt.Rate)
			}
		}
		if !near(s.Measured, measured) || !near(s.FirstMiss, firstMiss) {
			t.Errorf("%dP:%dD: measured %v, first miss %v; its points %+v say %v and %v", s.P, s.D, s.Measured, s.FirstMiss, s.Points, measured, firstMiss)
		}
		if s.Measured > bestMeasured.Measured {
			bestMeasured = s
		}
		if s.P == c.Predicted.P {
			predicted = &c.Splits[i]
		}
	}
	if predicted == nil {
		t.Fatalf("the predicted split %dP:%dD was not measured", c.Predicted.P, c.Predicted.D)
	}
	var verdict string
	switch {
	case bestMeasured.Measured == 0:
		verdict = "none met"
	case predicted.Measured >= bestMeasured.Measured:
		verdict = "right"
	case predicted.FirstMiss == 0 || predicted.FirstMiss > bestMeasured.Measured:
		verdict = "tie"
	default:
		verdict = "wrong"
	}
	if c.Verdict != verdict || !near(c.Best.Measured, bestMeasured.Measured) || !near(c.PredictedMeasured, predicted.Measured) {
		t.Errorf("verdict %q, best %dP:%dD at %v, the predicted split at %v; the measured splits say %q, best %v, predicted %v",
			c.Verdict, c.Best.P, c.Best.D, c.Best.Measured, c.PredictedMeasured, verdict, bestMeasured.Measured, predicted.Measured)
	}
}
