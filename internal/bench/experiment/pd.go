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
	"text/tabwriter"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/hoststat"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// PD configures the P/D experiment, `tandem bench experiment pd`.
type PD struct {
	// Common's Model empty is a random-weight smollm2-135m (bf16) model
	// created once in the user cache (Model).
	Common
	// Workloads run in order against every configuration.
	Workloads []Workload
	// Configs are the configurations compared (Configurations lists them).
	Configs []string
	// MNBTs are the colocated engine's --max-num-batched-tokens values to
	// tune over; with one value there is no tuning.
	MNBTs []int
	// Intervals are the colocated-cadence engine's
	// --prefill-schedule-interval values to tune over, at the tuned
	// --max-num-batched-tokens; with one value there is no tuning.
	Intervals []int
	// TuneRequests is the requests of each tuning run.
	TuneRequests int
	// Threshold is the conditional configuration's --pd-threshold.
	Threshold int
	// AdaptiveArgs are extra `tandem proxy` flags of the adaptive
	// configuration (the planner's, such as --plan-min-dwell).
	AdaptiveArgs []string
	// Engines, when positive, runs the phased comparison (runPhased):
	// Engines engines in every configuration, one configuration after the
	// other, the adaptive one per cell of its own grid. 0 is the 1P+1D
	// comparison, the configurations alternating level by level.
	Engines int
	// Splits are the pd and conditional configurations' P:D splits with
	// Engines (ParseSplits; every P+D is Engines).
	Splits []Split
	// AdaptiveStart is how many of the Engines the adaptive configuration
	// starts as prefill engines; negative: half of them. 0, the colocated
	// split (every engine a decode prefilling its own prompts), from which
	// the planner adds a prefill pool when it pays: on the long mix's
	// balanced cell it met 9.3–9.8 req/s from there against 7.8–8.5 from
	// 2P:2D, whose first moves, made before the bursts were seen, went
	// toward 3P:1D (docs/performance-log.md).
	AdaptiveStart int
	// AdaptiveTTFTScales and AdaptiveTPOTScales are the cells the
	// adaptive configuration runs in with Engines: one run per pair, its
	// planner given the workload's objectives scaled by the pair (default
	// 1 and 1: the workload's own).
	AdaptiveTTFTScales, AdaptiveTPOTScales []float64
	// Warmup is the requests every configuration is sent at the lowest
	// rate before its measured ones, not counted, with Engines (0: one
	// level's, requests × rounds; negative: none): the adaptive planner's
	// first window, and the same start for the static configurations.
	Warmup int
	// PlanWindow and PlanMinDwell are the adaptive planner's --plan-window
	// and --plan-min-dwell with Engines (0: a level's length at the
	// workload's middle rate, and half the window).
	PlanWindow, PlanMinDwell time.Duration
	// Requests and Rounds are per rate; without Engines the configurations
	// alternate order each round.
	Requests, Rounds int
	// Goal is the fraction of requests that must meet both SLOs for a rate
	// to count.
	Goal float64
	Seed uint64
	// MaxContext clips requests (0: the model's context).
	MaxContext int
	// Timeout limits each request.
	Timeout time.Duration
}

// tuned are the colocated engines' tuned settings: the chunk budget of
// both and the prefill cadence of colocated-cadence. Every other
// configuration's engines get the same chunk budget, so that none is
// compared at a budget the others were not given.
type tuned struct{ mnbt, interval int }

// mnbtFlags are the `tandem serve` flags of chunk budget mnbt.
func mnbtFlags(mnbt int) []string { return []string{"--max-num-batched-tokens", strconv.Itoa(mnbt)} }

// configuration starts one of the compared setups and returns its URL and,
// for the disaggregated setups, the proxy's and engines' URLs for the time
// breakdown.
type configuration func(r *pdRun, ctx context.Context, t tuned) (url string, metricsURLs []string, err error)

// configurations are the setups PD.Configs may name.
var configurations = map[string]configuration{
	"colocated": func(r *pdRun, ctx context.Context, t tuned) (string, []string, error) {
		url, err := r.startColocated(ctx, r.model, t.mnbt, 0)
		return url, nil, err
	},
	// colocated-cadence is the colocated engine with vLLM's answer to the
	// ITL tail on one engine: prefill compute only on every Nth step while
	// requests decode (--prefill-schedule-interval, tuned).
	"colocated-cadence": func(r *pdRun, ctx context.Context, t tuned) (string, []string, error) {
		url, err := r.startColocated(ctx, r.model, t.mnbt, t.interval)
		return url, nil, err
	},
	"pd": func(r *pdRun, ctx context.Context, t tuned) (string, []string, error) {
		return r.startPD(ctx, "pd", t)
	},
	// conditional is the router's conditional disaggregation: each request
	// is prefilled remotely only when its uncached prompt on the chosen
	// decode engine is at least Threshold tokens, else the decode engine
	// prefills it itself; the decode is chosen by prefix affinity.
	"conditional": func(r *pdRun, ctx context.Context, t tuned) (string, []string, error) {
		return r.startPD(ctx, "conditional", t, "--pd-decider", "conditional", "--pd-threshold", strconv.Itoa(r.cfg.Threshold),
			"--policy", "prefix", "--model", r.model)
	},
}

// Configurations are the names PD.Configs may use: those of the
// configurations map and adaptive, which is started per workload (its
// planner's objectives are the workload's).
func Configurations() []string {
	return []string{"colocated", "colocated-cadence", "pd", "conditional", Adaptive}
}

// pdRun is one run of the P/D experiment.
type pdRun struct {
	*experiment
	cfg PD
}

// PDSummary is the P/D experiment's summary.json: what was run and each
// workload's per-configuration goodput rate and throughput, the load
// average, and the P:D model.
type PDSummary struct {
	Model    string   `json:"model"`
	CPUs     []int    `json:"cpus"`
	Configs  []string `json:"configs"`
	Requests int      `json:"requests_per_rate_and_round"`
	// Engines is every configuration's engines in a phased run (0: the
	// 1P+1D comparison).
	Engines int       `json:"engines,omitempty"`
	Rounds  int       `json:"rounds"`
	Started time.Time `json:"started"`
	MNBT    int       `json:"colocated_max_num_batched_tokens"`
	// Interval is colocated-cadence's --prefill-schedule-interval (0
	// without that configuration).
	Interval  int               `json:"colocated_cadence_prefill_schedule_interval,omitempty"`
	Workloads []WorkloadSummary `json:"workloads"`
	PDModels  []bench.PDModel   `json:"pd_ratio_model"`
	// Failed lists the levels with failed requests (empty for a clean
	// run).
	Failed []string `json:"failed,omitempty"`
}

// WorkloadSummary is one workload of PDSummary.
type WorkloadSummary struct {
	Name       string             `json:"name"`
	MeanPrompt float64            `json:"mean_prompt_tokens"`
	MeanOutput float64            `json:"mean_output_tokens"`
	SLO        bench.SLO          `json:"slo"`
	Load       hoststat.LoadStats `json:"load_average"`
	// Capacity is each configuration's goodput rate and the throughput of
	// each rate.
	Capacity []bench.Capacity `json:"capacity"`
	// Grid is each configuration's goodput rate under every pair of scaled
	// TTFT and TPOT objectives.
	Grid []bench.GridCell `json:"slo_grid,omitempty"`
	// Breakdowns split each configuration's TTFT at each rate by the
	// answers' Server-Timing headers.
	Breakdowns []LevelBreakdown `json:"ttft_breakdowns,omitempty"`
	// Cadence is what the colocated-cadence engine's cadence did over the
	// workload (nil without that configuration).
	Cadence *CadenceSteps `json:"cadence,omitempty"`
	// Planner is where the adaptive configuration's planner stood at the
	// end of the workload (nil without that configuration).
	Planner *PlannerState `json:"planner,omitempty"`
	// Adaptive compares the adaptive configuration with the best static
	// one in every cell of Grid (nil without that configuration).
	Adaptive []AdaptiveCell `json:"adaptive_against_static,omitempty"`
	// AdaptiveRuns are the adaptive configuration's runs of a phased
	// comparison, one per cell it planned for.
	AdaptiveRuns []AdaptiveRun `json:"adaptive_runs,omitempty"`
}

// LevelBreakdown is the TTFT breakdown of one configuration at one rate.
type LevelBreakdown struct {
	Target string     `json:"target"`
	Load   bench.Load `json:"load"`
	*bench.Breakdown
}

// RunPD starts the configurations to compare on this machine, runs the
// same workloads against each in alternating rounds, stops them and writes
// report.txt, summary.json, results-WORKLOAD.json and plots into cfg.Out.
// Failed requests are listed in the report and make it return an error.
func RunPD(ctx context.Context, cfg PD) error {
	for _, c := range cfg.Configs {
		if !slices.Contains(Configurations(), c) {
			return fmt.Errorf("--configs: unknown configuration %q (want %s)", c, strings.Join(Configurations(), ", "))
		}
	}
	if len(cfg.MNBTs) == 0 {
		return fmt.Errorf("--mnbt-sweep: no values")
	}
	if len(cfg.Intervals) == 0 && slices.Contains(cfg.Configs, "colocated-cadence") {
		return fmt.Errorf("--interval-sweep: no values (the colocated-cadence configuration needs at least one --prefill-schedule-interval)")
	}
	if err := checkGoal(cfg.Goal); err != nil {
		return err
	}
	if err := cfg.checkPhased(); err != nil {
		return err
	}
	if cfg.Model == "" {
		cfg.defaults()
		dir, err := ModelProgress(cfg.Log, cfg.Progress, modelinit.ShapeSmolLM2135M, "bf16")
		if err != nil {
			return err
		}
		cfg.Model = dir
	}
	x, err := newExperiment(&cfg.Common, cfg.Goal)
	if err != nil {
		return err
	}
	x.requests, x.rounds, x.seed, x.maxContext, x.timeout = cfg.Requests, cfg.Rounds, cfg.Seed, cfg.MaxContext, cfg.Timeout
	defer x.stopAll()
	r := &pdRun{experiment: x, cfg: cfg}
	if cfg.Engines > 0 {
		return r.runPhased(ctx)
	}
	return r.run(ctx)
}

// checkPhased checks the phased comparison's settings and fills in the
// adaptive cells' default (the workload's own objectives).
func (cfg *PD) checkPhased() error {
	if cfg.Engines == 0 {
		return nil
	}
	if cfg.Engines < 2 {
		return fmt.Errorf("--engines %d: want at least 2 (a prefill and a decode engine)", cfg.Engines)
	}
	if len(cfg.Splits) == 0 && (slices.Contains(cfg.Configs, "pd") || slices.Contains(cfg.Configs, "conditional")) {
		return fmt.Errorf("--splits: no split for the pd and conditional configurations")
	}
	for _, s := range cfg.Splits {
		if s.P < 1 || s.D < 1 || s.P+s.D != cfg.Engines {
			return fmt.Errorf("--splits: %d:%d is not a split of --engines %d", s.P, s.D, cfg.Engines)
		}
	}
	if len(cfg.AdaptiveTTFTScales) == 0 {
		cfg.AdaptiveTTFTScales = []float64{1}
	}
	if len(cfg.AdaptiveTPOTScales) == 0 {
		cfg.AdaptiveTPOTScales = []float64{1}
	}
	for _, f := range append(slices.Clone(cfg.AdaptiveTTFTScales), cfg.AdaptiveTPOTScales...) {
		if !(f > 0) {
			return fmt.Errorf("--adaptive-ttft-scales, --adaptive-tpot-scales: %v is not a positive factor", f)
		}
	}
	if cfg.PlanWindow < 0 || cfg.PlanMinDwell < 0 {
		return fmt.Errorf("--plan-window %v, --plan-min-dwell %v: want positive durations (0: scaled to the level length)", cfg.PlanWindow, cfg.PlanMinDwell)
	}
	return nil
}

// startPD starts a prefill and a decode engine on half the CPUs each, with
// the colocated engine's tuned chunk budget, and a tandem proxy in front of
// them with proxyArgs; name prefixes their log files.
func (r *pdRun) startPD(ctx context.Context, name string, t tuned, proxyArgs ...string) (string, []string, error) {
	c, err := r.startClusterWith(ctx, r.model, filepath.Base(r.model), clusterOpts{name: name, prefill: 1, decode: 1,
		engineArgs: mnbtFlags(t.mnbt), proxyArgs: proxyArgs})
	if err != nil {
		return "", nil, err
	}
	return c.url, c.metricsURLs, nil
}

func (r *pdRun) run(ctx context.Context) error {
	x, cfg := r.experiment, r.cfg
	var report strings.Builder
	w := io.MultiWriter(&report, cfg.Stdout)
	fmt.Fprintf(w, "tandem bench experiment pd: model %s, %d CPUs %v, %s, started %s\n", x.model, len(x.cpus), x.cpus, runtime.Version(), time.Now().Format(time.DateTime))
	fmt.Fprintf(w, "configurations: %s; %d requests per rate and round, %d rounds, configurations alternating; every rate and round has prompts of its own\n", strings.Join(cfg.Configs, ", "), x.requests, x.rounds)
	fmt.Fprintf(w, "load average (1 min) at the start: %s\n\n", hoststat.LoadAvgText())
	summary := PDSummary{Model: x.model, CPUs: x.cpus, Configs: cfg.Configs, Requests: x.requests, Rounds: x.rounds, Started: time.Now()}

	t, err := r.tuneAll(ctx, w)
	if err != nil {
		return err
	}
	summary.MNBT = t.mnbt
	if slices.Contains(cfg.Configs, "colocated-cadence") {
		summary.Interval = t.interval
	}
	var targets []bench.Target
	metricsURLs := map[string][]string{}
	cadenceURL := ""
	for _, c := range cfg.Configs {
		if c == Adaptive {
			// Started per workload, below.
			targets = append(targets, bench.Target{Name: c})
			continue
		}
		url, murls, err := configurations[c](r, ctx, t)
		if err != nil {
			return err
		}
		if c == "colocated-cadence" {
			cadenceURL = url
		}
		targets = append(targets, bench.Target{Name: c, URL: url})
		metricsURLs[c] = murls
	}
	var suites []*bench.Suite
	for _, wl := range cfg.Workloads {
		fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v ==\n", wl.Name, wl.SLO.TTFT, wl.SLO.TPOT)
		var adaptive *cluster
		if i := slices.Index(cfg.Configs, Adaptive); i >= 0 {
			if adaptive, err = r.startAdaptive(ctx, wl, t); err != nil {
				return err
			}
			targets[i].URL = adaptive.url
			metricsURLs[Adaptive] = adaptive.metricsURLs
		}
		before := map[string]map[string]float64{}
		for _, c := range cfg.Configs {
			if len(metricsURLs[c]) > 0 {
				before[c] = scrapeAll(ctx, metricsURLs[c])
			}
		}
		cadenceBefore, cadenceOK := CadenceSteps{}, false
		if cadenceURL != "" {
			cadenceBefore, cadenceOK = scrapeCadence(ctx, cadenceURL)
		}
		sampler := hoststat.StartLoadSampler(5 * time.Second)
		s, err := x.runWorkload(ctx, targets, wl, loadsOf(wl.Rates), x.rounds, x.requests)
		load := sampler.Stop()
		if err != nil {
			return err
		}
		var plan *PlannerState
		if adaptive != nil {
			if p, ok := scrapePlanner(ctx, adaptive.url); ok {
				plan = &p
			}
		}
		var cadence *CadenceSteps
		if cadenceOK {
			if after, ok := scrapeCadence(ctx, cadenceURL); ok {
				d := cadenceDelta(cadenceBefore, after, t.interval)
				cadence = &d
			}
		}
		if err := bench.WriteTable(w, s); err != nil {
			return err
		}
		fmt.Fprintf(w, "load average (1 min) during the workload: %s\n", load)
		if cadence != nil {
			writeCadence(w, *cadence)
		}
		if plan != nil {
			writePlanner(w, *plan)
		}
		cells := adaptiveCells(s.Grid)
		writeAdaptiveCells(w, cells, bench.PooledNote(s))
		for _, c := range cfg.Configs {
			if len(metricsURLs[c]) > 0 {
				writeBreakdown(w, c, before[c], scrapeAll(ctx, metricsURLs[c]))
			}
		}
		if adaptive != nil {
			r.stopCluster(adaptive)
		}
		if err := bench.WriteJSONFile(filepath.Join(x.out, "results-"+wl.Name+".json"), s); err != nil {
			return err
		}
		files, err := plot.Suite(x.out, wl.Name+"-", s)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "plots: %s\n\n", strings.Join(files, ", "))
		suites = append(suites, s)
		ws := WorkloadSummary{Name: wl.Name, SLO: wl.SLO, Load: load, Capacity: s.Capacity, Grid: s.Grid, Cadence: cadence, Planner: plan, Adaptive: cells}
		ws.MeanPrompt, ws.MeanOutput = s.Plan.Workload.Stats()
		for _, r := range s.Results {
			if r.Breakdown != nil {
				ws.Breakdowns = append(ws.Breakdowns, LevelBreakdown{Target: r.Target, Load: r.Load, Breakdown: r.Breakdown})
			}
		}
		summary.Workloads = append(summary.Workloads, ws)
		x.noteFailures(s, wl.Name)
	}
	writeCapacities(w, suites)
	summary.PDModels = r.writePDModels(w, suites)
	return x.finish(w, &summary, &report)
}

// writePDModels prints the P:D model of every workload, fitted to the pd
// configuration's requests.
func (r *pdRun) writePDModels(w io.Writer, suites []*bench.Suite) []bench.PDModel {
	fmt.Fprintln(w)
	if !slices.Contains(r.cfg.Configs, "pd") {
		fmt.Fprintln(w, "P:D ratio model: not fitted (it needs the pd configuration's requests)")
		return nil
	}
	bench.WritePDModelHeader(w)
	var out []bench.PDModel
	for _, s := range suites {
		m := bench.ModelPD(s, "pd", r.maxNumSeqs())
		m.Write(w, s.Plan.SLO)
		out = append(out, m)
	}
	return out
}

// writeCapacities prints, per workload and configuration side by side,
// the goodput rate and the request and output-token throughput of each
// rate.
func writeCapacities(w io.Writer, suites []*bench.Suite) {
	if len(suites) == 0 {
		return
	}
	goal := 100 * suites[0].Plan.Goal
	fmt.Fprintf(w, "\nGoodput rate: the highest tested arrival rate at which %.0f%% of requests met both SLOs (\"≥\": every rate met it, \"<\": none did;\n"+
		"in brackets a linear estimate between the tested rates); then per rate: completed req/s, output tok/s, SLO met\n", goal)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  workload\tconfig\tgoodput rate\tper rate")
	for _, s := range suites {
		for _, c := range s.Capacity {
			rate := rateText(c.Bound, c.GoodputRate, c.FirstMiss, fmt.Sprintf("%.3g", c.Interpolated))
			if c.NonMonotone {
				rate += " (not monotone)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Plan.Workload.Name, c.Target, rate, c.Levels())
		}
	}
	_ = tw.Flush()
}
