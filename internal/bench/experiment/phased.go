package experiment

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/hoststat"
	"github.com/tandem-serve/tandem/internal/launch"
)

// Split is a P:D split of the phased comparison's engines.
type Split struct{ P, D int }

// String is "PpDd", as the split's configurations are named
// ("pd-1p3d").
func (s Split) String() string { return fmt.Sprintf("%dp%dd", s.P, s.D) }

// ParseSplits parses "P:D,P:D" (each P and D at least 1, P+D = engines);
// empty is every split of engines.
func ParseSplits(s string, engines int) ([]Split, error) {
	if strings.TrimSpace(s) == "" {
		var out []Split
		for p := 1; p < engines; p++ {
			out = append(out, Split{p, engines - p})
		}
		return out, nil
	}
	var out []Split
	for f := range strings.SplitSeq(s, ",") {
		ps, ds, ok := strings.Cut(strings.TrimSpace(f), ":")
		p, perr := strconv.Atoi(ps)
		d, derr := strconv.Atoi(ds)
		if !ok || perr != nil || derr != nil || p < 1 || d < 1 {
			return nil, fmt.Errorf("split %q: want P:D with P and D at least 1, e.g. 1:3", f)
		}
		if p+d != engines {
			return nil, fmt.Errorf("split %q has %d engines: every configuration has --engines %d", f, p+d, engines)
		}
		out = append(out, Split{p, d})
	}
	return out, nil
}

// phase is one configuration of the phased comparison, started on a
// cluster of its own for one workload.
type phase struct {
	// name is the target's name in the tables ("colocated", "pd-1p3d",
	// "adaptive", "adaptive-ttft0.5-tpot2").
	name string
	opts clusterOpts
	// adaptive marks the adaptive configuration, planning for the
	// workload's objectives scaled by ttft and tpot.
	adaptive   bool
	ttft, tpot float64
}

// noRemote is the colocated engines' --pd-threshold: no prompt is that
// long, so every prompt is prefilled where it decodes (the proxy has no
// prefill engine to send one to).
const noRemote = 1 << 30

// staticPhases are the static configurations of cfg.Configs at Engines,
// for workload wl, each engine with chunk budget t.mnbt: colocated (and
// colocated-cadence) as Engines colocated engines behind the router's
// defaults, pd and conditional at every split.
func (r *pdRun) staticPhases(wl Workload, t tuned) []phase {
	cfg, n := r.cfg, r.cfg.Engines
	defaults := []string{"--policy", "prefix", "--pd-decider", "conditional", "--model", r.model}
	var out []phase
	for _, c := range cfg.Configs {
		switch c {
		case "colocated", "colocated-cadence":
			_, flags := colocatedFlags(t.mnbt, 0)
			if c == "colocated-cadence" {
				_, flags = colocatedFlags(t.mnbt, t.interval)
			}
			out = append(out, phase{name: c, opts: clusterOpts{name: wl.Name + "-" + c, decode: n, role: launch.RoleBoth,
				engineArgs: flags, proxyArgs: append(slices.Clone(defaults), "--pd-threshold", strconv.Itoa(noRemote))}})
		case "pd", "conditional":
			for _, s := range cfg.Splits {
				name := c + "-" + s.String()
				args := append(slices.Clone(defaults), "--pd-decider", "always")
				if c == "conditional" {
					args = append(slices.Clone(defaults), "--pd-threshold", strconv.Itoa(cfg.Threshold))
				}
				out = append(out, phase{name: name, opts: clusterOpts{name: wl.Name + "-" + name, prefill: s.P, decode: s.D,
					engineArgs: mnbtFlags(t.mnbt), proxyArgs: args}})
			}
		}
	}
	return out
}

// adaptivePhases are the adaptive configuration's runs for workload wl,
// one per cell of AdaptiveTTFTScales × AdaptiveTPOTScales: Engines
// engines, --role both, started with PD.AdaptiveStart prefill engines (colocated by default), with chunk
// budget t.mnbt, behind a proxy whose planner acts on the cell's
// objectives with the plan window and dwell timing gives.
func (r *pdRun) adaptivePhases(wl Workload, t tuned, timing planTiming) []phase {
	cfg, n := r.cfg, r.cfg.Engines
	if !slices.Contains(cfg.Configs, Adaptive) {
		return nil
	}
	start := min(cfg.AdaptiveStart, n-1)
	if cfg.AdaptiveStart < 0 {
		start = n / 2
	}
	var out []phase
	for _, ft := range cfg.AdaptiveTTFTScales {
		for _, fp := range cfg.AdaptiveTPOTScales {
			name := AdaptiveCellName(ft, fp)
			cell := wl
			cell.SLO.TTFT, cell.SLO.TPOT = scaleDuration(wl.SLO.TTFT, ft), scaleDuration(wl.SLO.TPOT, fp)
			args := append(r.adaptiveProxyArgs(cell), "--plan-window", timing.window.String(), "--plan-min-dwell", timing.dwell.String(),
				"--plan-interval", timing.interval.String())
			// The user's extra flags last again: they win over the timing.
			args = append(args, cfg.AdaptiveArgs...)
			out = append(out, phase{name: name, adaptive: true, ttft: ft, tpot: fp, opts: clusterOpts{name: wl.Name + "-" + name,
				prefill: start, decode: n - start, role: launch.RoleBoth, engineArgs: mnbtFlags(t.mnbt), proxyArgs: args}})
		}
	}
	return out
}

func scaleDuration(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// planTiming is what the adaptive configuration's planner is given for a
// workload: its window, minimum dwell and decision period, and the
// warm-up every configuration is sent before its measured requests.
type planTiming struct {
	window, dwell, interval time.Duration
	warmup                  int
	warmupRate              float64
}

// plannerMinRequests is the fewest requests the planner decides on (its
// Config.MinRequests default): a window shorter than they take to arrive
// at the lowest rate would hold every decision.
const plannerMinRequests = 20

// timing is the planner's timing for workload wl: PlanWindow and
// PlanMinDwell when set, else scaled to the level length (a level's
// requests at the workload's middle rate, at least the time 1.5× the
// planner's fewest requests take at the lowest rate; half of it), a
// decision every quarter of the window (at most 5 s, the proxy's
// default), and Warmup requests (0: one level's) at the lowest rate.
func (r *pdRun) timing(wl Workload) planTiming {
	cfg := r.cfg
	rates := slices.Sorted(slices.Values(wl.Rates))
	level := float64(r.requests*max(r.rounds, 1)) / rates[len(rates)/2]
	level = max(level, 1.5*plannerMinRequests/rates[0])
	t := planTiming{window: cfg.PlanWindow, dwell: cfg.PlanMinDwell, warmup: cfg.Warmup, warmupRate: rates[0]}
	if t.window == 0 {
		t.window = time.Duration(level * float64(time.Second)).Round(100 * time.Millisecond)
	}
	if t.dwell == 0 {
		t.dwell = (t.window / 2).Round(100 * time.Millisecond)
	}
	t.interval = min(5*time.Second, max((t.window/4).Round(100*time.Millisecond), 100*time.Millisecond))
	if t.warmup == 0 {
		t.warmup = r.requests * max(r.rounds, 1)
	}
	t.warmup = max(t.warmup, 0)
	return t
}

// phaseResult is one phase's measured run.
type phaseResult struct {
	phase
	suite   *bench.Suite
	planner *PlannerState
	steps   []PlanStep
}

// runPhased is the comparison at Engines engines per configuration: per
// workload, each configuration on a cluster of its own, its rates back to
// back from the lowest (the adaptive one after a warm-up), then the next
// configuration. The static configurations are scored in every cell of the
// SLO grid from their one run; the adaptive one runs once per cell of its
// reduced grid, planning for that cell's objectives, and is compared with
// the best static configuration there.
func (r *pdRun) runPhased(ctx context.Context) error {
	x, cfg := r.experiment, r.cfg
	var report strings.Builder
	w := io.MultiWriter(&report, cfg.Stdout)
	fmt.Fprintf(w, "tandem bench experiment pd: model %s, %d CPUs %v, %s, started %s\n", x.model, len(x.cpus), x.cpus, runtime.Version(), time.Now().Format(time.DateTime))
	var splits []string
	for _, s := range cfg.Splits {
		splits = append(splits, fmt.Sprintf("%d:%d", s.P, s.D))
	}
	fmt.Fprintf(w, "configurations: %s; %d engines each (pd and conditional at the splits %s); %d requests per rate and round, %d rounds;\n",
		strings.Join(cfg.Configs, ", "), cfg.Engines, strings.Join(splits, ", "), x.requests, x.rounds)
	fmt.Fprintf(w, "phases: each configuration on a cluster of its own per workload, its rates back to back from the lowest; every configuration gets the same prompts\n")
	if slices.Contains(cfg.Configs, Adaptive) {
		fmt.Fprintf(w, "adaptive: one run per cell, TTFT × %s by TPOT × %s, its planner acting on that cell's objectives\n", floats(cfg.AdaptiveTTFTScales), floats(cfg.AdaptiveTPOTScales))
	}
	fmt.Fprintf(w, "load average (1 min) at the start: %s\n\n", hoststat.LoadAvgText())
	summary := PDSummary{Model: x.model, CPUs: x.cpus, Configs: cfg.Configs, Requests: x.requests, Rounds: x.rounds, Started: time.Now(), Engines: cfg.Engines}
	t, err := r.tuneAll(ctx, w)
	if err != nil {
		return err
	}
	summary.MNBT = t.mnbt
	if slices.Contains(cfg.Configs, "colocated-cadence") {
		summary.Interval = t.interval
	}
	fmt.Fprintf(w, "every engine of every configuration: --max-num-batched-tokens %d\n\n", t.mnbt)
	var suites []*bench.Suite
	for _, wl := range cfg.Workloads {
		ws, s, err := r.runPhasedWorkload(ctx, w, wl, t)
		if err != nil {
			return err
		}
		suites = append(suites, s)
		summary.Workloads = append(summary.Workloads, ws)
	}
	writeCapacities(w, suites)
	fmt.Fprintln(w, "\nP:D ratio model: not fitted with --engines (it is fitted to the 1P+1D pd configuration's requests)")
	return x.finish(w, &summary, &report)
}

// runPhasedWorkload runs every phase of workload wl and reports it.
func (r *pdRun) runPhasedWorkload(ctx context.Context, w io.Writer, wl Workload, t tuned) (WorkloadSummary, *bench.Suite, error) {
	x := r.experiment
	fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v ==\n", wl.Name, wl.SLO.TTFT, wl.SLO.TPOT)
	rates := slices.Sorted(slices.Values(wl.Rates))
	base, err := x.plan(ctx, nil, wl, loadsOf(rates), x.rounds, x.requests)
	if err != nil {
		return WorkloadSummary{}, nil, err
	}
	timing := r.timing(wl)
	base.Warmup = &bench.Warmup{Requests: timing.warmup}
	if timing.warmup > 0 {
		base.Warmup.Rate = timing.warmupRate
	}
	var warm *bench.Plan
	if timing.warmup > 0 {
		fmt.Fprintf(w, "warm-up: every configuration is sent %d requests at %g req/s before its measured ones (not counted; the same prompts for all)\n", timing.warmup, timing.warmupRate)
		if warm, err = x.plan(ctx, nil, wl, loadsOf([]float64{timing.warmupRate}), 1, timing.warmup); err != nil {
			return WorkloadSummary{}, nil, err
		}
	}
	phases := r.staticPhases(wl, t)
	if ad := r.adaptivePhases(wl, t, timing); len(ad) > 0 {
		fmt.Fprintf(w, "adaptive's planner: --plan-window %v --plan-min-dwell %v --plan-interval %v (a level is %d requests, %.1f s at the middle rate)",
			timing.window, timing.dwell, timing.interval, x.requests*max(x.rounds, 1), float64(x.requests*max(x.rounds, 1))/rates[len(rates)/2])
		if len(r.cfg.AdaptiveArgs) > 0 {
			fmt.Fprintf(w, "; proxy flags %s", strings.Join(r.cfg.AdaptiveArgs, " "))
		}
		fmt.Fprintln(w)
		phases = append(phases, ad...)
	}
	sampler := hoststat.StartLoadSampler(5 * time.Second)
	var results []phaseResult
	for _, ph := range phases {
		res, err := r.runPhase(ctx, w, wl, ph, base, warm)
		if err != nil {
			sampler.Stop()
			return WorkloadSummary{}, nil, err
		}
		results = append(results, res)
	}
	load := sampler.Stop()

	// The main suite: the static configurations and the adaptive run
	// planning for the workload's own objectives.
	s := joinSuites(base, wl.SLO, x.goal, results, func(p phaseResult) bool { return !p.adaptive || p.name == Adaptive })
	if err := bench.WriteTable(w, s); err != nil {
		return WorkloadSummary{}, nil, err
	}
	fmt.Fprintf(w, "load average (1 min) during the workload: %s\n", load)
	staticOnly := joinSuites(base, wl.SLO, x.goal, results, func(p phaseResult) bool { return !p.adaptive })
	var cells []bench.GridCell
	var runs []AdaptiveRun
	for _, res := range results {
		if !res.adaptive {
			continue
		}
		one := joinSuites(base, scaleSLO(wl.SLO, res.ttft, res.tpot), x.goal, []phaseResult{res}, nil)
		c, cell, ok := adaptiveCell(staticOnly, one, res.ttft, res.tpot)
		if ok {
			cells = append(cells, cell)
		}
		writeAdaptiveRun(w, res.name, one.Plan.SLO, c)
		if res.planner != nil {
			fmt.Fprint(w, "  ")
			writePlanner(w, *res.planner)
		}
		writePlanSteps(w, res.steps)
		runs = append(runs, AdaptiveRun{Name: res.name, TTFTScale: res.ttft, TPOTScale: res.tpot, SLO: one.Plan.SLO, Capacity: c, Planner: res.planner, Steps: res.steps})
		if err := bench.WriteJSONFile(filepath.Join(x.out, "results-"+wl.Name+"-"+res.name+".json"), one); err != nil {
			return WorkloadSummary{}, nil, err
		}
	}
	adaptive := adaptiveCells(cells)
	if len(adaptive) > 0 {
		fmt.Fprintln(w, "(in the grid above \"adaptive\" is the run planning for the workload's own objectives, scored after the fact; below, each cell's own run)")
		writeAdaptiveCells(w, adaptive, bench.PooledNote(s))
	}
	if err := bench.WriteJSONFile(filepath.Join(x.out, "results-"+wl.Name+".json"), s); err != nil {
		return WorkloadSummary{}, nil, err
	}
	files, err := plot.Suite(x.out, wl.Name+"-", s)
	if err != nil {
		return WorkloadSummary{}, nil, err
	}
	fmt.Fprintf(w, "plots: %s\n\n", strings.Join(files, ", "))
	ws := WorkloadSummary{Name: wl.Name, SLO: wl.SLO, Load: load, Capacity: s.Capacity, Grid: s.Grid, Adaptive: adaptive, AdaptiveRuns: runs}
	ws.MeanPrompt, ws.MeanOutput = s.Plan.Workload.Stats()
	for _, res := range results {
		if res.name == Adaptive {
			ws.Planner = res.planner
		}
	}
	for _, r := range s.Results {
		if r.Breakdown != nil {
			ws.Breakdowns = append(ws.Breakdowns, LevelBreakdown{Target: r.Target, Load: r.Load, Breakdown: r.Breakdown})
		}
	}
	x.noteFailures(s, wl.Name)
	for _, res := range results {
		if res.adaptive && res.name != Adaptive {
			x.noteFailures(res.suite, wl.Name)
		}
	}
	return ws, s, nil
}

// runPhase starts ph's cluster, sends warm (when not nil) and then base's
// levels to it, and stops it. The adaptive proxy's planner is watched
// throughout.
func (r *pdRun) runPhase(ctx context.Context, w io.Writer, wl Workload, ph phase, base, warm *bench.Plan) (phaseResult, error) {
	x := r.experiment
	res := phaseResult{phase: ph}
	c, err := r.startClusterWith(ctx, r.model, filepath.Base(r.model), ph.opts)
	if err != nil {
		return res, err
	}
	defer r.stopCluster(c)
	var watch *planWatch
	if ph.adaptive {
		watch = watchPlan(ctx, c.url, 500*time.Millisecond)
	}
	if warm != nil {
		p := *warm
		p.Targets = []bench.Target{{Name: ph.name + "-warmup", URL: c.url}}
		ws, err := bench.Run(ctx, &p)
		if err != nil {
			if watch != nil {
				watch.Stop(ctx)
			}
			return res, err
		}
		x.noteFailures(ws, wl.Name+" warm-up")
	}
	if watch != nil {
		watch.markStart()
	}
	before := scrapeAll(ctx, c.metricsURLs)
	p := *base
	p.Targets = []bench.Target{{Name: ph.name, URL: c.url}}
	s, err := bench.Run(ctx, &p)
	if watch != nil {
		res.steps = watch.Stop(ctx)
		if st, ok := scrapePlanner(ctx, c.url); ok {
			res.planner = &st
		}
	}
	if err != nil {
		return res, err
	}
	writeBreakdown(w, ph.name, before, scrapeAll(ctx, c.metricsURLs))
	res.suite = s
	return res, nil
}

// joinSuites is one suite of the results of the phases keep accepts (all
// when nil), scored under slo and goal: its plan is base's with those
// phases as its targets.
func joinSuites(base *bench.Plan, slo bench.SLO, goal float64, results []phaseResult, keep func(phaseResult) bool) *bench.Suite {
	p := *base
	p.Targets = nil
	s := &bench.Suite{Plan: &p, Prompts: bench.DescribePrompts(base.Workload)}
	for _, res := range results {
		if keep != nil && !keep(res) {
			continue
		}
		p.Targets = append(p.Targets, res.suite.Plan.Targets...)
		if s.Started.IsZero() {
			s.Started = res.suite.Started
		}
		for _, r := range res.suite.Results {
			c := *r
			s.Results = append(s.Results, &c)
		}
	}
	s.Rescore(slo, goal)
	return s
}

func scaleSLO(slo bench.SLO, ttft, tpot float64) bench.SLO {
	slo.TTFT, slo.TPOT = scaleDuration(slo.TTFT, ttft), scaleDuration(slo.TPOT, tpot)
	return slo
}

func floats(fs []float64) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strings.Join(parts, ", ")
}

// AdaptiveRun is one run of the adaptive configuration in the phased
// comparison: the cell it planned for and what it reached.
type AdaptiveRun struct {
	Name      string    `json:"name"`
	TTFTScale float64   `json:"ttft_scale"`
	TPOTScale float64   `json:"tpot_scale"`
	SLO       bench.SLO `json:"slo"`
	// Capacity is its goodput rate under SLO.
	Capacity bench.Capacity `json:"capacity"`
	// Planner is where the planner stood at the end (its metrics), Steps
	// every decision it made.
	Planner *PlannerState `json:"planner,omitempty"`
	Steps   []PlanStep    `json:"plan_steps,omitempty"`
}
