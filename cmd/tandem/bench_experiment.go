package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/launch"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// runBenchExperiment is `tandem bench experiment pd` (and, for `ratio`,
// runBenchRatio): it starts the
// configurations to compare on this machine, runs the same workloads
// against each in alternating rounds, stops them and writes a report with
// plots.
func runBenchExperiment(args []string) error {
	if len(args) > 0 && args[0] == "ratio" {
		return runBenchRatio(args[1:])
	}
	if len(args) == 0 || args[0] != "pd" {
		return errors.New("usage: tandem bench experiment pd [--model DIR] [flags]   (P/D against colocated)\n" +
			"       tandem bench experiment ratio [flags]          (the P:D model checked on simulated engines)")
	}
	fs := flag.NewFlagSet("bench experiment pd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench experiment pd [--model DIR] [flags]\n\n"+
			"Compares, on this machine and model, a colocated engine on all cores (its\n"+
			"--max-num-batched-tokens chosen by a small sweep on the long workload) with 1 prefill\n"+
			"+ 1 decode engine (half the cores each) behind tandem proxy, and the same pair behind a\n"+
			"proxy with the conditional decider (prefill on the decode engine when the uncached\n"+
			"prompt is short). Each workload runs open loop (Poisson) at each rate against every\n"+
			"configuration, in alternating rounds, each level with prompts of its own. Writes\n"+
			"report.txt (tables, each configuration's goodput rate and throughput per rate, the TTFT\n"+
			"of every configuration split by the answers' Server-Timing spans, and a P:D model fitted\n"+
			"to the pd configuration's prefill service and decode step times), summary.json,\n"+
			"results-*.json (every request) and plots into --out. Failed requests are listed in the\n"+
			"report and make the command fail.\n\n"+
			"Without --model it creates a random-weight smollm2-135m (bf16) model in the user cache\n"+
			"once and uses it.\n\n")
		fs.PrintDefaults()
	}
	var (
		modelDir   = fs.String("model", "", "model directory (default: a random-weight smollm2-135m bf16 model created once in the user cache, as `tandem model init --shape smollm2-135m --dtype bf16` makes it)")
		outDir     = fs.String("out", "bench-pd", "directory for the report, JSON and plots")
		workloads  = fs.String("workloads", "chat,long", "workloads to run: chat and/or long")
		chatRates  = fs.String("chat-rates", "1,2,4", "arrival rates (req/s) of the chat workload")
		longRates  = fs.String("long-rates", "0.2,0.4,0.6", "arrival rates (req/s) of the long workload")
		requests   = fs.Int("requests", 24, "requests per rate and round")
		rounds     = fs.Int("rounds", 2, "rounds per rate; the configurations alternate order")
		mnbtSweep  = fs.String("mnbt-sweep", "128,256,512,2048", "colocated --max-num-batched-tokens values to tune over (one value: no tuning)")
		tuneReqs   = fs.Int("tune-requests", 12, "requests per tuning run (long workload at its middle rate)")
		configs    = fs.String("configs", "colocated,pd,conditional", "configurations: colocated (one engine, all cores), pd (1P+1D, --pd-decider always), conditional (1P+1D, --pd-decider conditional --policy prefix)")
		threshold  = fs.Int("pd-threshold", 256, "conditional: uncached prompt tokens from which the prefill goes to the prefill engine (the proxy's --pd-threshold)")
		kvMemory   = fs.String("kv-cache-memory", "1GiB", "every engine's --kv-cache-memory (several engines share this machine's RAM; empty: the engine's default)")
		slos       = addWorkloadSLOFlags(fs, "")
		goal       = fs.Float64("goal", bench.DefaultGoal, "fraction of requests that must meet both SLOs for a rate to count (the goodput rate)")
		seed       = fs.Uint64("seed", 0, "seed for prompts, lengths and arrivals")
		maxContext = fs.Int("max-context", 0, "clip requests to this many tokens (default: the model's)")
		timeout    = fs.Duration("timeout", 10*time.Minute, "limit for each request")
		extra      = fs.String("engine-args", "", "extra `tandem serve` flags for every engine, space-separated")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *goal <= 0 || *goal > 1 {
		return fmt.Errorf("--goal %v: want a fraction in (0, 1]", *goal)
	}
	if *modelDir == "" {
		dir, err := experimentModel(os.Stderr, modelinit.ShapeSmolLM2135M, "bf16")
		if err != nil {
			return err
		}
		*modelDir = dir
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	mnbts, err := parseInts(*mnbtSweep)
	if err != nil {
		return fmt.Errorf("--mnbt-sweep: %w", err)
	}
	engineArgs := strings.Fields(*extra)
	if *kvMemory != "" {
		engineArgs = append([]string{"--kv-cache-memory", *kvMemory}, engineArgs...)
	}
	x := &experiment{exe: exe, model: *modelDir, out: *outDir, extra: engineArgs, threshold: *threshold, goal: *goal,
		requests: *requests, rounds: *rounds, seed: *seed, maxContext: *maxContext, timeout: *timeout,
		log: os.Stderr}
	specs := map[string]experimentWorkload{
		"chat": {name: "chat", rates: *chatRates, slo: slos.chat()},
		"long": {name: "long", rates: *longRates, slo: slos.long()},
	}
	if x.workloads, err = experimentWorkloads(*workloads, specs, "--%s-rates"); err != nil {
		return err
	}
	for _, c := range strings.Split(*configs, ",") {
		c = strings.TrimSpace(c)
		if _, ok := configurations[c]; !ok {
			return fmt.Errorf("--configs: unknown configuration %q (want colocated, pd, conditional)", c)
		}
		x.configs = append(x.configs, c)
	}
	if err := os.MkdirAll(filepath.Join(x.out, "logs"), 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer x.stopAll()
	return x.run(ctx, mnbts, *tuneReqs)
}

// experimentWorkloads picks the workloads a --workloads list names from
// specs, each with its rates parsed; rateFlag names a workload's rates
// flag in errors ("--%s-rates").
func experimentWorkloads(list string, specs map[string]experimentWorkload, rateFlag string) ([]experimentWorkload, error) {
	var out []experimentWorkload
	for _, w := range strings.Split(list, ",") {
		s, ok := specs[strings.TrimSpace(w)]
		if !ok {
			return nil, fmt.Errorf("--workloads: unknown workload %q (want chat, long)", w)
		}
		var err error
		if s.parsed, err = parseFloats(s.rates); err != nil {
			return nil, fmt.Errorf(rateFlag+": %w", s.name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q in %q: want positive integers separated by commas", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

type experimentWorkload struct {
	name   string
	rates  string
	parsed []float64
	slo    bench.SLO
}

// experiment is one run of `tandem bench experiment pd`.
type experiment struct {
	exe, model, out string
	extra           []string
	threshold       int
	goal            float64
	workloads       []experimentWorkload
	configs         []string
	requests        int
	rounds          int
	seed            uint64
	maxContext      int
	timeout         time.Duration
	log             io.Writer
	procs           []*child
	cpus            []int
	secret          string
	// nextLevel is the first prompt level of the next run: every run (a
	// tuning run, a workload's rates and rounds) takes levels of its own,
	// so none repeats another's prompts.
	nextLevel int
	// failed lists the levels with failed requests, tuning included.
	failed []string
}

// configuration starts one of the compared setups and returns its URL and,
// for the disaggregated setups, the proxy's and engines' URLs for the time
// breakdown. mnbt is the colocated engine's chunk budget.
type configuration func(x *experiment, ctx context.Context, mnbt int) (url string, metricsURLs []string, err error)

// configurations are the setups `--configs` may name.
var configurations = map[string]configuration{
	"colocated": (*experiment).startColocated,
	"pd": func(x *experiment, ctx context.Context, _ int) (string, []string, error) {
		return x.startPD(ctx, "pd")
	},
	// conditional is the router's conditional disaggregation: each request
	// is prefilled remotely only when its uncached prompt on the chosen
	// decode engine is at least --pd-threshold tokens, else the decode
	// engine prefills it itself; the decode is chosen by prefix affinity.
	"conditional": func(x *experiment, ctx context.Context, _ int) (string, []string, error) {
		return x.startPD(ctx, "conditional", "--pd-decider", "conditional", "--pd-threshold", strconv.Itoa(x.threshold),
			"--policy", "prefix", "--model", x.model)
	},
}

func (x *experiment) logf(format string, args ...any) {
	fmt.Fprintf(x.log, "experiment: "+format+"\n", args...)
}

// setup finds the CPUs the engines may use and the KV secret they share.
func (x *experiment) setup() error {
	cpus, err := launch.AllowedCPUs()
	if err != nil {
		return err
	}
	x.cpus = cpus
	x.secret = cmp.Or(os.Getenv(kvxfer.SecretEnv), kvxfer.GenerateSecret())
	return nil
}

func (x *experiment) run(ctx context.Context, mnbts []int, tuneReqs int) error {
	if err := x.setup(); err != nil {
		return err
	}
	cpus := x.cpus
	var report strings.Builder
	w := io.MultiWriter(&report, os.Stdout)
	fmt.Fprintf(w, "tandem bench experiment pd: model %s, %d CPUs %v, %s, started %s\n", x.model, len(cpus), cpus, runtime.Version(), time.Now().Format(time.DateTime))
	fmt.Fprintf(w, "configurations: %s; %d requests per rate and round, %d rounds, configurations alternating; every rate and round has prompts of its own\n", strings.Join(x.configs, ", "), x.requests, x.rounds)
	fmt.Fprintf(w, "load average (1 min) at the start: %s\n\n", loadAvgText())
	summary := experimentSummary{Model: x.model, CPUs: cpus, Configs: x.configs, Requests: x.requests, Rounds: x.rounds, Started: time.Now()}

	mnbt := mnbts[len(mnbts)-1]
	var err error
	if len(mnbts) > 1 && contains(x.configs, "colocated") {
		if mnbt, err = x.tune(ctx, w, mnbts, tuneReqs); err != nil {
			return err
		}
	}
	summary.MNBT = mnbt
	var targets []bench.Target
	metricsURLs := map[string][]string{}
	for _, c := range x.configs {
		url, murls, err := configurations[c](x, ctx, mnbt)
		if err != nil {
			return err
		}
		targets = append(targets, bench.Target{Name: c, URL: url})
		metricsURLs[c] = murls
	}
	var suites []*bench.Suite
	for _, wl := range x.workloads {
		fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v ==\n", wl.name, wl.slo.TTFT, wl.slo.TPOT)
		before := map[string]map[string]float64{}
		for _, c := range x.configs {
			if len(metricsURLs[c]) > 0 {
				before[c] = scrapeAll(ctx, metricsURLs[c])
			}
		}
		sampler := startLoadSampler(5 * time.Second)
		s, err := x.runWorkload(ctx, targets, wl, loadsOf(wl.parsed), x.rounds, x.requests)
		load := sampler.stop()
		if err != nil {
			return err
		}
		if err := bench.WriteTable(w, s); err != nil {
			return err
		}
		fmt.Fprintf(w, "load average (1 min) during the workload: %s\n", load)
		for _, c := range x.configs {
			if len(metricsURLs[c]) > 0 {
				writeBreakdown(w, c, before[c], scrapeAll(ctx, metricsURLs[c]))
			}
		}
		if err := writeJSONFile(filepath.Join(x.out, "results-"+wl.name+".json"), s); err != nil {
			return err
		}
		files, err := plot.Suite(x.out, wl.name+"-", s)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "plots: %s\n\n", strings.Join(files, ", "))
		suites = append(suites, s)
		ws := workloadSummary{Name: wl.name, SLO: wl.slo, Load: load, Capacity: s.Capacity, Grid: s.Grid}
		ws.MeanPrompt, ws.MeanOutput = s.Plan.Workload.Stats()
		for _, r := range s.Results {
			if r.Breakdown != nil {
				ws.Breakdowns = append(ws.Breakdowns, levelBreakdown{Target: r.Target, Load: r.Load, Breakdown: r.Breakdown})
			}
		}
		summary.Workloads = append(summary.Workloads, ws)
		x.noteFailures(s, wl.name)
	}
	writeCapacities(w, suites)
	summary.PDModels = x.writePDModels(w, suites)
	x.stopAll()
	if len(x.failed) > 0 {
		fmt.Fprintf(w, "\nFAILED requests (they count as SLO misses above; see %s):\n", filepath.Join(x.out, "logs"))
		for _, f := range x.failed {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	summary.Failed = x.failed
	if err := writeJSONFile(filepath.Join(x.out, "summary.json"), summary); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(x.out, "report.txt"), []byte(report.String()), 0o644); err != nil {
		return err
	}
	if len(x.failed) > 0 {
		return fmt.Errorf("requests failed: %s (see the report and the logs directory in %s)", strings.Join(x.failed, "; "), x.out)
	}
	return nil
}

// noteFailures records the levels of s (named what) with failed requests,
// with their most frequent error.
func (x *experiment) noteFailures(s *bench.Suite, what string) {
	for _, r := range s.Results {
		if r.Failed > 0 {
			f := fmt.Sprintf("%d of %s's requests at %s (%s)", r.Failed, r.Target, r.Load, what)
			if len(r.Errors) > 0 {
				f += ": " + r.Errors[0].Error
			}
			x.failed = append(x.failed, f)
		}
	}
}

// writePDModels prints the P:D model of every workload, fitted to the pd
// configuration's requests.
func (x *experiment) writePDModels(w io.Writer, suites []*bench.Suite) []bench.PDModel {
	fmt.Fprintln(w)
	if !contains(x.configs, "pd") {
		fmt.Fprintln(w, "P:D ratio model: not fitted (it needs the pd configuration's requests)")
		return nil
	}
	bench.WritePDModelHeader(w)
	var out []bench.PDModel
	for _, s := range suites {
		m := bench.ModelPD(s, "pd", x.maxNumSeqs())
		m.Write(w, s.Plan.SLO)
		out = append(out, m)
	}
	return out
}

// maxNumSeqs is the engines' --max-num-seqs: from --engine-args, else
// tandem serve's default.
func (x *experiment) maxNumSeqs() int {
	n := 64
	for i, a := range x.extra {
		v, ok := strings.CutPrefix(a, "--max-num-seqs=")
		if !ok && a == "--max-num-seqs" && i+1 < len(x.extra) {
			v, ok = x.extra[i+1], true
		}
		if k, err := strconv.Atoi(v); ok && err == nil && k > 0 {
			n = k
		}
	}
	return n
}

// experimentSummary is summary.json: what was run and each workload's
// per-configuration goodput rate and throughput, the load average, and the
// P:D model.
type experimentSummary struct {
	Model     string            `json:"model"`
	CPUs      []int             `json:"cpus"`
	Configs   []string          `json:"configs"`
	Requests  int               `json:"requests_per_rate_and_round"`
	Rounds    int               `json:"rounds"`
	Started   time.Time         `json:"started"`
	MNBT      int               `json:"colocated_max_num_batched_tokens"`
	Workloads []workloadSummary `json:"workloads"`
	PDModels  []bench.PDModel   `json:"pd_ratio_model"`
	// Failed lists the levels with failed requests (empty for a clean
	// run).
	Failed []string `json:"failed,omitempty"`
}

type workloadSummary struct {
	Name       string    `json:"name"`
	MeanPrompt float64   `json:"mean_prompt_tokens"`
	MeanOutput float64   `json:"mean_output_tokens"`
	SLO        bench.SLO `json:"slo"`
	Load       loadStats `json:"load_average"`
	// Capacity is each configuration's goodput rate and the throughput of
	// each rate.
	Capacity []bench.Capacity `json:"capacity"`
	// Grid is each configuration's goodput rate under every pair of scaled
	// TTFT and TPOT objectives.
	Grid []bench.GridCell `json:"slo_grid,omitempty"`
	// Breakdowns split each configuration's TTFT at each rate by the
	// answers' Server-Timing headers.
	Breakdowns []levelBreakdown `json:"ttft_breakdowns,omitempty"`
}

type levelBreakdown struct {
	Target string     `json:"target"`
	Load   bench.Load `json:"load"`
	*bench.Breakdown
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
			var rate string
			switch c.Bound {
			case "none":
				rate = "-"
			case "below":
				rate = fmt.Sprintf("< %.3g", c.FirstMiss)
			case "at least":
				rate = fmt.Sprintf("≥ %.3g", c.GoodputRate)
			default:
				rate = fmt.Sprintf("%.3g (%.3g)", c.GoodputRate, c.Interpolated)
			}
			if c.NonMonotone {
				rate += " (not monotone)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", s.Plan.Workload.Name, c.Target, rate, c.Levels())
		}
	}
	_ = tw.Flush()
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func loadsOf(rates []float64) []bench.Load {
	var ls []bench.Load
	for _, r := range rates {
		ls = append(ls, bench.Load{Rate: r, Burstiness: 1})
	}
	return ls
}

// runWorkload builds the workload (prompt ids from the model's tokenizer)
// and runs it against every target.
func (x *experiment) runWorkload(ctx context.Context, targets []bench.Target, wl experimentWorkload, loads []bench.Load, rounds, requests int) (*bench.Suite, error) {
	p, err := x.plan(ctx, targets, wl, loads, rounds, requests)
	if err != nil {
		return nil, err
	}
	return bench.Run(ctx, p)
}

// plan builds the workload's plan against targets (prompt ids from the
// model's tokenizer), its levels numbered after every earlier run's.
func (x *experiment) plan(ctx context.Context, targets []bench.Target, wl experimentWorkload, loads []bench.Load, rounds, requests int) (*bench.Plan, error) {
	p := &bench.Plan{Targets: targets, Model: filepath.Base(x.model), Loads: loads, Rounds: rounds, Seed: x.seed, Timeout: x.timeout,
		SLO: wl.slo, Goal: x.goal, Progress: x.log, ProgressEvery: 10 * time.Second}
	wf := &workloadFlags{kind: wl.name, requests: requests, seed: x.seed, maxContext: x.maxContext, tokenizer: x.model, given: map[string]bool{}}
	if err := prepare(ctx, p, wf, x.log); err != nil {
		return nil, err
	}
	p.FirstLevel = x.nextLevel
	x.nextLevel += p.Levels()
	return p, nil
}

// tune runs the long workload at its middle rate against a colocated engine
// with each chunk budget and keeps the one with the highest SLO attainment,
// then (on a tie, which a few requests make likely) the larger area under
// the attainment curve over the SLO scales — the margin left on both TTFT
// and TPOT — then the lower ITL p99: a 2048-token chunk is a second-long
// step on a small CPU, and comparing P/D against that would be a straw
// man. Goodput in requests/s is not a criterion: at equal attainment it
// differs by the noise in the level's duration.
func (x *experiment) tune(ctx context.Context, w io.Writer, mnbts []int, reqs int) (int, error) {
	wl := x.workloads[len(x.workloads)-1]
	for _, c := range x.workloads {
		if c.name == "long" {
			wl = c
		}
	}
	rate := wl.parsed[len(wl.parsed)/2]
	fmt.Fprintf(w, "== tuning the colocated engine's --max-num-batched-tokens on the %s workload at %g req/s, %d requests ==\n", wl.name, rate, reqs)
	type score struct{ attained, curve, itl float64 }
	better := func(a, b score) bool {
		if a.attained != b.attained {
			return a.attained > b.attained
		}
		if math.Abs(a.curve-b.curve) > 1e-9 {
			return a.curve > b.curve
		}
		return a.itl < b.itl
	}
	best, bestScore := 0, score{-1, -1, math.Inf(1)}
	for _, m := range mnbts {
		url, _, err := x.startColocated(ctx, m)
		if err != nil {
			return 0, err
		}
		s, err := x.runWorkload(ctx, []bench.Target{{Name: fmt.Sprintf("colocated-mnbt%d", m), URL: url}}, wl, loadsOf([]float64{rate}), 1, reqs)
		x.stopAll()
		if err != nil {
			return 0, err
		}
		x.noteFailures(s, "tuning")
		r := s.Results[0]
		sc := score{attained: r.Attained, itl: r.ITL.P99}
		for _, c := range r.Curve {
			sc.curve += c.Attainment
		}
		fmt.Fprintf(w, "  --max-num-batched-tokens %5d: SLO met %3.0f%% (summed over the SLO scales %.2f), goodput %.2f req/s, TTFT p90 %.0f ms, TPOT p99 %.1f ms, ITL p99 %.0f ms\n",
			m, 100*r.Attained, sc.curve, r.Goodput, r.TTFT.P90, r.TPOT.P99, r.ITL.P99)
		if better(sc, bestScore) {
			best, bestScore = m, sc
		}
	}
	fmt.Fprintf(w, "  chosen: %d\n\n", best)
	return best, nil
}

// scrapeAll reads the _sum and _count of every histogram on the /metrics
// pages of urls, keyed by metric name.
func scrapeAll(ctx context.Context, urls []string) map[string]float64 {
	out := map[string]float64{}
	for _, u := range urls {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			name, val, ok := strings.Cut(line, " ")
			if !ok || strings.HasPrefix(line, "#") {
				continue
			}
			base, _, _ := strings.Cut(name, "{")
			if strings.HasSuffix(base, "_sum") || strings.HasSuffix(base, "_count") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					out[base] += f
				}
			}
		}
		resp.Body.Close()
	}
	return out
}

// writeBreakdown prints the mean time per request of each P/D phase the
// proxy and engines measure, from their histograms' growth over a workload:
// means over all rates and rounds, beside the per-request spans of the
// table's TTFT breakdown (from the answers' Server-Timing headers), which
// they cross-check.
func writeBreakdown(w io.Writer, config string, before, after map[string]float64) {
	mean := func(name string) (float64, bool) {
		n := after[name+"_count"] - before[name+"_count"]
		if n <= 0 {
			return 0, false
		}
		return 1000 * (after[name+"_sum"] - before[name+"_sum"]) / n, true
	}
	fmt.Fprintf(w, "P/D time breakdown (means over the %s configuration's requests of all rates, from the proxy's and engines' /metrics histograms):\n", config)
	for _, m := range []struct{ name, what string }{
		{"tandem:proxy_prefill_seconds", "proxy: prefill leg (queue + prefill on the prefill engine)"},
		{"tandem:proxy_decode_ttfb_seconds", "proxy: decode leg to its first byte (KV pull + first decode step + queue)"},
		{"tandem:kv_transfer_seconds", "decode engine: KV transfer of one request"},
		{"vllm:request_queue_time_seconds", "both engines: time waiting to be scheduled"},
		{"vllm:time_to_first_token_seconds", "both engines: their own TTFT (prefill's = its leg)"},
		{"tandem:proxy_request_seconds", "proxy: whole request"},
	} {
		if v, ok := mean(m.name); ok {
			fmt.Fprintf(w, "  %-70s %8.1f ms\n", m.what, v)
		} else {
			fmt.Fprintf(w, "  %-70s %8s\n", m.what, "n/a")
		}
	}
}

// experimentModel returns the directory of a random-weight model of shape
// in the user cache (…/tandem/models/SHAPE-DTYPE), creating it the first
// time as `tandem model init` does. It is written beside its final place
// and renamed, so an interrupted run leaves no half model.
func experimentModel(w io.Writer, shape, dtype string) (string, error) {
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory for the model (set XDG_CACHE_HOME or pass --model): %w", err)
	}
	dir := filepath.Join(c, "tandem", "models", shape+"-"+dtype)
	if fileExists(filepath.Join(dir, "model.safetensors")) && fileExists(filepath.Join(dir, "config.json")) && isTokenizerDir(dir) {
		fmt.Fprintf(w, "experiment: model %s (random weights, shape %s %s)\n", dir, shape, dtype)
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".partial-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	fmt.Fprintf(w, "experiment: no --model: creating a random-weight %s (%s) model in %s (once; pass --model DIR for another)\n", shape, dtype, dir)
	if _, err := modelinit.Init(tmp, shape, dtype, 0); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// workloadSLOs are the --slo-{chat,long}-{ttft,tpot} flags of the
// experiments, read after parsing.
type workloadSLOs struct{ chatTTFT, chatTPOT, longTTFT, longTPOT *time.Duration }

// addWorkloadSLOFlags defines the experiments' SLO flags on fs (with note
// appended to their help: the ratio experiment's are simulated time).
func addWorkloadSLOFlags(fs *flag.FlagSet, note string) workloadSLOs {
	return workloadSLOs{
		chatTTFT: fs.Duration("slo-chat-ttft", time.Second, "chat workload TTFT SLO"+note),
		chatTPOT: fs.Duration("slo-chat-tpot", 100*time.Millisecond, "chat workload TPOT SLO"+note),
		longTTFT: fs.Duration("slo-long-ttft", 5*time.Second, "long workload TTFT SLO"+note),
		longTPOT: fs.Duration("slo-long-tpot", 100*time.Millisecond, "long workload TPOT SLO"+note),
	}
}

func (w workloadSLOs) chat() bench.SLO { return bench.SLO{TTFT: *w.chatTTFT, TPOT: *w.chatTPOT} }

func (w workloadSLOs) long() bench.SLO { return bench.SLO{TTFT: *w.longTTFT, TPOT: *w.longTPOT} }
