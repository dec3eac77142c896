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
)

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	const stat = "cpu  100 5 50 800 20 3 2 10 40 0\ncpu0 50 2 25 400 10 1 1 5 20 0\nintr 1\n"
	busy, total, ok := parseProcStat(stat)
	if !ok || busy != 170 || total != 990 {
		t.Errorf("parseProcStat = %d busy of %d (ok %v), want 170 of 990 (guest time is in user already)", busy, total, ok)
	}
	if _, _, ok := parseProcStat("intr 1\n"); ok {
		t.Error("a file without the cpu line parsed")
	}
}

func TestParsePIDStatCountsFromTheLastParenthesis(t *testing.T) {
	// A command name with spaces and a ')' of its own.
	const stat = "4242 (tandem (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 123 45 0 0 20 0 9 0 100 1000 200 18446744073709551615"
	if ticks, ok := parsePIDStat(stat); !ok || ticks != 168 {
		t.Errorf("parsePIDStat = %d (ok %v), want utime 123 + stime 45", ticks, ok)
	}
	if _, ok := parsePIDStat("4242 (short) S 1"); ok {
		t.Error("a truncated stat parsed")
	}
}

func TestHostWatchWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	h := &hostWatch{proxyPID: 7}
	h.prev = cpuSample{at: t0, busy: 0, total: 0, hostOK: true, proxy: 0, proxyOK: true, proxyPID: 7}
	// Two seconds, 2 cores (200 jiffies a second): 50% then 100% busy;
	// the proxy uses 0.5 then 1.5 cores, this process 0.1 each second.
	h.add(cpuSample{at: t0.Add(time.Second), busy: 100, total: 200, hostOK: true, proxy: 50, proxyOK: true, proxyPID: 7, self: 10, load1: 1.5, loadKnown: true})
	h.add(cpuSample{at: t0.Add(2 * time.Second), busy: 300, total: 400, hostOK: true, proxy: 200, proxyOK: true, proxyPID: 7, self: 20, load1: 2.5, loadKnown: true})
	st := h.win
	s := h.sums
	st.Seconds, st.Busy, st.Proxy, st.Self = s.wall, s.busy/s.total, s.proxy/s.wall, s.self/s.wall
	want := hostStats{Seconds: 2, Busy: 0.75, BusyPeak: 1, Proxy: 1, ProxyPeak: 1.5, Self: 0.1, SelfPeak: 0.1, Load: 2.5}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"seconds", st.Seconds, want.Seconds}, {"busy", st.Busy, want.Busy}, {"busy peak", st.BusyPeak, want.BusyPeak},
		{"proxy", st.Proxy, want.Proxy}, {"proxy peak", st.ProxyPeak, want.ProxyPeak}, {"self", st.Self, want.Self},
		{"self peak", st.SelfPeak, want.SelfPeak}, {"load", st.Load, want.Load}} {
		if math.Abs(f.got-f.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if st.saturated() {
		t.Error("75% busy counted as saturated")
	}
	if !(hostStats{Busy: 0.9}).saturated() {
		t.Error("90% busy not counted as saturated")
	}
	// A new proxy's counters do not subtract from the old one's.
	h.add(cpuSample{at: t0.Add(3 * time.Second), busy: 300, total: 600, hostOK: true, proxy: 5, proxyOK: true, proxyPID: 8, self: 20})
	if h.sums.proxy != 2 {
		t.Errorf("proxy CPU %v after a new proxy, want the old 2 core-seconds", h.sums.proxy)
	}
}

func TestScaleCheckScalesEveryRateOnce(t *testing.T) {
	m := &bench.PDModel{Workload: "chat", PrefillRate: 2, DecodeRate: 2}
	pts := []bench.RatioPoint{
		{P: 4, D: 4, Predicted: 8, Measured: 6, FirstMiss: 7, Bound: "search", Points: []bench.SearchPoint{{Rate: 6, Goodput: 5.5}}},
		{P: 5, D: 3, Predicted: 6, Measured: 4, FirstMiss: 5, Bound: "search"},
	}
	c := scaleCheck(bench.NewRatioCheck(m, 8, pts), 0.5)
	if c.Predicted.Goodput != 4 || c.Curve[3].Goodput != 4 || c.Splits[0].Measured != 3 || c.Splits[0].Predicted != 4 ||
		c.Splits[0].Points[0].Rate != 3 || c.Best.Measured != 3 || c.Best.Points[0].Rate != 3 || c.PredictedMeasured != 3 {
		t.Errorf("scaled check %+v", c)
	}
	if pts[0].Points[0].Rate != 6 {
		t.Error("scaling changed the caller's points")
	}
}

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
	var sum ratioSummary
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
