package experiment

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/launch"
)

// TestParseSplits: every split of N by default; a list must add up to N
// with at least one engine on each side.
func TestParseSplits(t *testing.T) {
	got, err := ParseSplits("", 4)
	if err != nil || !slices.Equal(got, []Split{{1, 3}, {2, 2}, {3, 1}}) {
		t.Errorf("ParseSplits(\"\", 4) = %v, %v; want 1:3, 2:2, 3:1", got, err)
	}
	got, err = ParseSplits("1:3, 3:1", 4)
	if err != nil || !slices.Equal(got, []Split{{1, 3}, {3, 1}}) || got[0].String() != "1p3d" {
		t.Errorf("ParseSplits(\"1:3, 3:1\", 4) = %v, %v", got, err)
	}
	for _, bad := range []string{"2:3", "0:4", "4", "a:b"} {
		if _, err := ParseSplits(bad, 4); err == nil {
			t.Errorf("ParseSplits(%q, 4) accepted", bad)
		}
	}
}

// TestPhases: with N engines every configuration has N engines and the
// tuned chunk budget (the pairs used to keep the engine's default):
// colocated engines behind the router's defaults with every prompt local,
// pd and conditional per split, and adaptive per cell, --role both, its
// planner given the cell's objectives and the timing scaled to the level,
// the user's proxy flags last.
func TestPhases(t *testing.T) {
	r := &pdRun{experiment: &experiment{procs: &procs{}, model: "/m/tiny", goal: 0.9, requests: 20, rounds: 1},
		cfg: PD{Engines: 4, Splits: []Split{{1, 3}, {3, 1}}, Threshold: 128, Configs: []string{"colocated", "pd", "conditional", Adaptive},
			AdaptiveTTFTScales: []float64{0.5, 1}, AdaptiveTPOTScales: []float64{1, 2}, AdaptiveArgs: []string{"--plan-hysteresis", "0.2"}}}
	wl := Workload{Name: "chat", Rates: []float64{16, 4, 8}, SLO: bench.SLO{TTFT: time.Second, TPOT: 100 * time.Millisecond}}
	tn := tuned{mnbt: 512, interval: 4}
	static := r.staticPhases(wl, tn)
	var names []string
	for _, p := range static {
		names = append(names, p.name)
		if p.opts.prefill+p.opts.decode != 4 || !slices.Contains(p.opts.engineArgs, "512") || p.adaptive {
			t.Errorf("%s: %+v, want 4 static engines with --max-num-batched-tokens 512", p.name, p.opts)
		}
	}
	if want := []string{"colocated", "pd-1p3d", "pd-3p1d", "conditional-1p3d", "conditional-3p1d"}; !slices.Equal(names, want) {
		t.Errorf("static phases %q, want %q", names, want)
	}
	arg := func(args []string, flag string) string {
		i := slices.Index(args, flag)
		for j := i + 1; j < len(args); j++ { // the last occurrence wins
			if args[j] == flag {
				i = j
			}
		}
		if i < 0 || i+1 >= len(args) {
			return ""
		}
		return args[i+1]
	}
	col := static[0].opts
	if col.prefill != 0 || col.role != launch.RoleBoth || arg(col.proxyArgs, "--pd-threshold") != "1073741824" || arg(col.proxyArgs, "--policy") != "prefix" {
		t.Errorf("colocated: %+v, want 4 engines --role both, prefix policy, every prompt local", col)
	}
	if pd := static[1].opts; pd.prefill != 1 || pd.decode != 3 || arg(pd.proxyArgs, "--pd-decider") != "always" || pd.name != "chat-pd-1p3d" {
		t.Errorf("pd-1p3d: %+v", pd)
	}
	if c := static[4].opts; c.prefill != 3 || arg(c.proxyArgs, "--pd-decider") != "conditional" || arg(c.proxyArgs, "--pd-threshold") != "128" {
		t.Errorf("conditional-3p1d: %+v", c)
	}

	timing := r.timing(wl)
	// A level is 20 requests at the middle rate, 8 req/s: 2.5 s; 1.5 × 20
	// requests at the lowest, 4 req/s, take 7.5 s, which wins.
	if timing.window != 7500*time.Millisecond || timing.dwell != 3800*time.Millisecond || timing.interval != 1900*time.Millisecond || timing.warmup != 20 || timing.warmupRate != 4 {
		t.Errorf("timing %+v, want window 7.5s, dwell 3.8s, interval 1.9s, warm-up 20 at 4 req/s", timing)
	}
	ad := r.adaptivePhases(wl, tn, timing)
	names = nil
	for _, p := range ad {
		names = append(names, p.name)
		a := p.opts.proxyArgs
		if p.opts.role != launch.RoleBoth || p.opts.prefill != 0 || p.opts.decode != 4 || !slices.Contains(p.opts.engineArgs, "512") || !p.adaptive ||
			arg(a, "--slo-ttft") != (time.Duration(p.ttft*float64(time.Second))).String() || arg(a, "--slo-tpot") != (time.Duration(p.tpot*float64(100*time.Millisecond))).String() ||
			arg(a, "--plan-window") != "7.5s" || arg(a, "--plan-min-dwell") != "3.8s" || arg(a, "--plan-interval") != "1.9s" || a[len(a)-1] != "0.2" || !slices.Contains(a, "--planner-act") {
			t.Errorf("%s: %+v", p.name, p.opts)
		}
	}
	if want := []string{"adaptive-ttft0.5-tpot1", "adaptive-ttft0.5-tpot2", "adaptive", "adaptive-ttft1-tpot2"}; !slices.Equal(names, want) {
		t.Errorf("adaptive phases %q, want %q", names, want)
	}
	// Started at half the engines in the prefill pool when asked.
	r.cfg.AdaptiveStart = -1
	if p := r.adaptivePhases(wl, tn, timing)[0].opts; p.prefill != 2 || p.decode != 2 {
		t.Errorf("AdaptiveStart -1: %dP:%dD, want 2P:2D", p.prefill, p.decode)
	}
	// Given explicitly, the window and dwell are the user's.
	r.cfg.PlanWindow, r.cfg.PlanMinDwell, r.cfg.Warmup = 30*time.Second, 10*time.Second, -1
	if tm := r.timing(wl); tm.window != 30*time.Second || tm.dwell != 10*time.Second || tm.interval != 5*time.Second || tm.warmup != 0 {
		t.Errorf("timing %+v, want the given window and dwell, a 5-s period, no warm-up", tm)
	}
}

// TestCheckPhased refuses splits that are not of N engines and fills in
// the adaptive cell of the workload's own objectives.
func TestCheckPhased(t *testing.T) {
	cfg := PD{Engines: 4, Configs: []string{"pd", Adaptive}, Splits: []Split{{2, 2}}}
	if err := cfg.checkPhased(); err != nil || !slices.Equal(cfg.AdaptiveTTFTScales, []float64{1}) || !slices.Equal(cfg.AdaptiveTPOTScales, []float64{1}) {
		t.Errorf("checkPhased: %v, cells %v × %v", err, cfg.AdaptiveTTFTScales, cfg.AdaptiveTPOTScales)
	}
	for _, bad := range []PD{
		{Engines: 1},
		{Engines: 4, Configs: []string{"pd"}},
		{Engines: 4, Configs: []string{"pd"}, Splits: []Split{{1, 2}}},
		{Engines: 4, Configs: []string{Adaptive}, AdaptiveTTFTScales: []float64{0}},
	} {
		if err := bad.checkPhased(); err == nil {
			t.Errorf("checkPhased accepted %+v", bad)
		}
	}
}

// TestPlanSteps: the watch keeps each decision once, times them from the
// start of the measured requests, and the report lists the moves and the
// reasons it held, counted.
func TestPlanSteps(t *testing.T) {
	w := &planWatch{zero: time.Now()}
	at := w.zero.Add(2 * time.Second)
	answer := func(at time.Time, p, d, thr int, held string) planAnswer {
		return planAnswer{Decision: &planDecision{At: at, Prefill: p, Decode: d, Threshold: thr, Held: held}}
	}
	w.note(answer(at, 2, 2, 256, "too few requests: 3 in the last 5s, need 20"))
	w.note(answer(at, 2, 2, 256, "too few requests: 3 in the last 5s, need 20")) // the same decision again
	w.zero = w.zero.Add(3 * time.Second)                                         // as markStart would, shifting the kept steps
	w.steps[0].T -= 3
	w.note(answer(at.Add(3*time.Second), 1, 3, 512, ""))
	w.note(answer(at.Add(4*time.Second), 1, 3, 512, "dwell: the split changed 1s ago, less than 2s"))
	if len(w.steps) != 3 || w.steps[0].T != -1 || w.steps[1].T != 2 {
		t.Fatalf("steps %+v, want three, at -1 s and 2 s first", w.steps)
	}
	var b strings.Builder
	writePlanSteps(&b, w.steps)
	for _, want := range []string{"3 decisions", "-1s 2P:2D thr 256 → +2s 1P:3D thr 512", "held: 1× dwell, 1× too few requests"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
