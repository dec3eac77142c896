package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/defaultmodel"
)

// runBenchRatio is `tandem bench experiment ratio`: it checks the P:D model
// of `tandem bench experiment pd` on simulated engines. It fits the model
// to a 1P+1D simulated run of each workload, then for each N measures the
// goodput rate of several P:D splits of N simulated engines behind a tandem
// proxy (the predicted best, its neighbours, and far ones) with a rate
// search, and reports the prediction against the measurement.
func runBenchRatio(args []string) error {
	fs := flag.NewFlagSet("bench experiment ratio", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench experiment ratio [flags]\n\n"+
			"Checks the P:D placement model of `tandem bench experiment pd` on simulated engines\n"+
			"(tandem serve --simulate: real engine processes whose forward pass sleeps for a time\n"+
			"model's step time, so each behaves like an engine with hardware of its own). For each\n"+
			"workload it fits the model to a 1 prefill + 1 decode simulated run at --fit-*-rates;\n"+
			"then for each N of --engines it prints the model's best P:D split and goodput, and\n"+
			"measures the goodput rate (the highest Poisson rate at which --goal of the requests meet\n"+
			"both SLOs, by a rate search around the model's prediction for the split) of the predicted\n"+
			"split, its --neighbours on either side, N/2 and the quarter on the other side, each on\n"+
			"a fresh cluster of P prefill + D decode simulated engines behind a tandem proxy process.\n"+
			"It watches the host while it measures (the proxy's and this process's CPU, the cores'\n"+
			"busy fraction, the load average) and marks a split HOST-BOUND when the host was near\n"+
			"saturation at the rate that bounded it. Writes report.txt, summary.json and ratio.png/svg\n"+
			"into --out.\n\n"+
			"Rates and SLOs in flags and in the check's table are in simulated time: with --sim-speed S\n"+
			"the engines run S times faster than real time, arrivals are sent S times faster and the\n"+
			"SLOs are divided by S (the fit's tables and the model's own lines are in wall-clock time).\n\n")
		fs.PrintDefaults()
	}
	var (
		simulate    = fs.String("simulate", simBuiltin, "time model of the simulated engines: builtin (a 135M model measured on a 2-core EPYC) or a profile from tandem profile")
		speed       = fs.Float64("sim-speed", 1, "run the simulated engines this many times faster than real time (below 1 when the host cannot keep up)")
		modelDir    = fs.String("model", "", "model directory giving the simulated engines their tokenizer and KV shape (default: the embedded stories260K, as tandem up --simulate uses)")
		outDir      = fs.String("out", "bench-ratio", "directory for the report, JSON, plot and logs")
		engines     = fs.String("engines", "8,16", "numbers of engines N to check the model at (e.g. 8,16,32)")
		workloads   = fs.String("workloads", "chat", "workloads: chat and/or long (as tandem bench experiment pd defines them)")
		chatRates   = fs.String("fit-chat-rates", "1,2,4", "arrival rates (req/s, simulated) of the chat workload's 1P+1D fitting run")
		longRates   = fs.String("fit-long-rates", "0.1,0.2,0.3", "arrival rates (req/s, simulated) of the long workload's 1P+1D fitting run")
		fitRequests = fs.Int("fit-requests", 48, "requests per rate of the fitting run")
		levelSecs   = fs.Float64("level-seconds", 30, "simulated seconds of Poisson arrivals per rate tried: a level sends max(--min-requests, rate × this) requests")
		minRequests = fs.Int("min-requests", 30, "fewest requests per rate tried")
		neighbours  = fs.Int("neighbours", 1, "splits measured on either side of the predicted best")
		far         = fs.Bool("far", true, "also measure splits far from the prediction: N/2 and the quarter on the other side (N/4 or 3N/4)")
		searchFrom  = fs.Float64("search-from", 0.6, "each split's rate search starts at this fraction of the model's rate for the split, doubles until a rate misses (at most 4 times the model's rate), then bisects")
		steps       = fs.Int("search-steps", 2, "bisection steps of each rate search after its bracket")
		slos        = addWorkloadSLOFlags(fs, " (simulated time)")
		goal        = fs.Float64("goal", bench.DefaultGoal, "fraction of requests that must meet both SLOs for a rate to count")
		seed        = fs.Uint64("seed", 0, "seed for prompts, lengths and arrivals")
		maxModelLen = fs.Int("max-model-len", 4096, "every simulated engine's --max-model-len (beyond the tokenizer model's, so long prompts fit)")
		timeout     = fs.Duration("timeout", 10*time.Minute, "limit for each request (wall clock)")
		extra       = fs.String("engine-args", "", "extra `tandem serve` flags for every engine, space-separated")
		proxyExtra  = fs.String("proxy-args", "", "extra `tandem proxy` flags, space-separated (default policy: round-robin)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *goal <= 0 || *goal > 1:
		return fmt.Errorf("--goal %v: want a fraction in (0, 1]", *goal)
	case !(*speed > 0):
		return fmt.Errorf("--sim-speed %v must be positive", *speed)
	case *levelSecs <= 0 || *minRequests < 1 || *fitRequests < 1 || *neighbours < 0 || *steps < 0 || *searchFrom <= 0 || *searchFrom > 4:
		return errors.New("--level-seconds, --min-requests and --fit-requests must be positive, --neighbours and --search-steps not negative, --search-from in (0, 4]")
	}
	ns, err := parseInts(*engines)
	if err != nil {
		return fmt.Errorf("--engines: %w", err)
	}
	for _, n := range ns {
		if n < 2 {
			return fmt.Errorf("--engines %d: a split needs at least 2 engines", n)
		}
	}
	if *modelDir == "" {
		dir, err := defaultmodel.Install("")
		if err != nil {
			return err
		}
		*modelDir = dir
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	sim := "--simulate"
	if *simulate != simBuiltin {
		abs, err := filepath.Abs(*simulate)
		if err != nil {
			return err
		}
		sim = "--simulate=" + abs
	}
	engineArgs := append([]string{sim, "--sim-speed", strconv.FormatFloat(*speed, 'g', -1, 64), "--max-model-len", strconv.Itoa(*maxModelLen)}, strings.Fields(*extra)...)
	x := &experiment{exe: exe, model: *modelDir, out: *outDir, extra: engineArgs, goal: *goal, requests: *fitRequests, rounds: 1,
		seed: *seed, timeout: *timeout, log: os.Stderr}
	r := &ratioRun{x: x, simulate: *simulate, speed: *speed, engines: ns, levelSecs: *levelSecs, minRequests: *minRequests,
		neighbours: *neighbours, steps: *steps, far: *far, searchFrom: *searchFrom, proxyArgs: strings.Fields(*proxyExtra)}
	specs := map[string]experimentWorkload{
		"chat": {name: "chat", rates: *chatRates, slo: slos.chat()},
		"long": {name: "long", rates: *longRates, slo: slos.long()},
	}
	if r.workloads, err = experimentWorkloads(*workloads, specs, "--fit-%s-rates"); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(x.out, "logs"), 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer x.stopAll()
	return r.run(ctx)
}

// ratioRun is one run of `tandem bench experiment ratio`. Its experiment
// starts the processes and builds the workloads; its rates and SLOs are
// wall-clock ones (the flags' simulated ones scaled by speed).
type ratioRun struct {
	x           *experiment
	simulate    string
	speed       float64
	engines     []int
	workloads   []experimentWorkload // rates and SLOs in simulated time
	levelSecs   float64
	minRequests int
	neighbours  int
	steps       int
	searchFrom  float64
	far         bool
	proxyArgs   []string
	watch       *hostWatch
	report      strings.Builder // what the report says so far
	sum         ratioSummary
}

// ratioSummary is summary.json.
type ratioSummary struct {
	Simulate  string          `json:"simulate"`
	Speed     float64         `json:"sim_speed"`
	Model     string          `json:"model"`
	CPUs      []int           `json:"cpus"`
	Engines   []int           `json:"engines"`
	Goal      float64         `json:"goal"`
	Started   time.Time       `json:"started"`
	Finished  time.Time       `json:"finished"`
	Workloads []ratioWorkload `json:"workloads"`
	Failed    []string        `json:"failed,omitempty"`
}

// ratioWorkload is one workload's fit and checks. Rates in Model are
// wall-clock requests/s, those of Checks simulated ones (wall ÷ speed).
type ratioWorkload struct {
	Name     string             `json:"name"`
	SLO      bench.SLO          `json:"slo_simulated"`
	FitRates []float64          `json:"fit_rates_simulated"`
	FitLoad  loadStats          `json:"fit_load_average"`
	Model    bench.PDModel      `json:"model_wall_clock"`
	Checks   []bench.RatioCheck `json:"checks_simulated_rates"`
}

func (r *ratioRun) run(ctx context.Context) error {
	x := r.x
	if err := x.setup(); err != nil {
		return err
	}
	r.watch = startHostWatch(time.Second)
	defer r.watch.stop()
	w := io.MultiWriter(&r.report, os.Stdout)
	r.sum = ratioSummary{Simulate: r.simulate, Speed: r.speed, Model: x.model, CPUs: x.cpus, Engines: r.engines, Goal: x.goal, Started: time.Now()}
	fmt.Fprintf(w, "tandem bench experiment ratio: simulated engines (--simulate %s, --sim-speed %g), tokenizer and KV shape of %s, %d CPUs %v, %s, started %s\n",
		r.simulate, r.speed, x.model, len(x.cpus), x.cpus, runtime.Version(), time.Now().Format(time.DateTime))
	fmt.Fprintf(w, "engines N: %v; each split of N is a fresh cluster of simulated engines (%s) behind a tandem proxy process %v; goal %.0f%% of requests meeting both SLOs\n",
		r.engines, strings.Join(x.extra, " "), r.proxyArgs, 100*x.goal)
	fmt.Fprintf(w, "load average (1 min) at the start: %s\n\n", loadAvgText())
	for _, wl := range r.workloads {
		r.sum.Workloads = append(r.sum.Workloads, ratioWorkload{Name: wl.name, SLO: wl.slo, FitRates: wl.parsed})
		if err := r.runWorkload(ctx, w, wl, &r.sum.Workloads[len(r.sum.Workloads)-1]); err != nil {
			return err
		}
	}
	var tail strings.Builder
	tw := io.MultiWriter(&tail, os.Stdout)
	r.writeChecks(tw)
	if len(x.failed) > 0 {
		fmt.Fprintf(tw, "\nFAILED requests (they count as SLO misses above; see %s):\n", filepath.Join(x.out, "logs"))
		for _, f := range x.failed {
			fmt.Fprintf(tw, "  %s\n", f)
		}
	}
	r.sum.Finished = time.Now()
	if err := r.save(tail.String()); err != nil {
		return err
	}
	if len(x.failed) > 0 {
		return fmt.Errorf("requests failed: %s (see the report and the logs directory in %s)", strings.Join(x.failed, "; "), x.out)
	}
	return nil
}

// checks are every workload's checks so far.
func (r *ratioRun) checks() []bench.RatioCheck {
	var out []bench.RatioCheck
	for _, rw := range r.sum.Workloads {
		out = append(out, rw.Checks...)
	}
	return out
}

// writeChecks writes the comparison table of every check so far.
func (r *ratioRun) writeChecks(w io.Writer) {
	fmt.Fprintf(w, "\n== the model against the measurement (rates in simulated req/s%s) ==\n", r.wallNote())
	bench.WriteRatioChecks(w, r.checks(), 1)
	fmt.Fprintf(w, "plot: %s\n", filepath.Join(r.x.out, "ratio.png"))
	fmt.Fprintf(w, "load average (1 min) now: %s\n", loadAvgText())
}

// save writes report.txt (the report so far, then tail), summary.json and
// the plot: after every check, so that an interrupted run keeps what it
// measured.
func (r *ratioRun) save(tail string) error {
	x := r.x
	r.sum.Failed = x.failed
	if err := writeJSONFile(filepath.Join(x.out, "summary.json"), r.sum); err != nil {
		return err
	}
	if _, err := plot.Ratio(x.out, "ratio", r.checks(), 1); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(x.out, "report.txt"), []byte(r.report.String()+tail), 0o644)
}

func (r *ratioRun) wallNote() string {
	if r.speed == 1 {
		return ""
	}
	return fmt.Sprintf("; wall-clock req/s are %g times these", r.speed)
}

// wall is wl with its rates and SLOs in wall-clock time.
func (r *ratioRun) wall(wl experimentWorkload) experimentWorkload {
	out := wl
	out.slo = wl.slo.Scale(1 / r.speed)
	out.parsed = nil
	for _, v := range wl.parsed {
		out.parsed = append(out.parsed, v*r.speed)
	}
	return out
}

// runWorkload fits the model to a 1P+1D run of wl and checks it at every N.
func (r *ratioRun) runWorkload(ctx context.Context, w io.Writer, wl experimentWorkload, rw *ratioWorkload) error {
	x := r.x
	ww := r.wall(wl)
	fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v (simulated; wall clock %v and %v) ==\n", wl.name, wl.slo.TTFT, wl.slo.TPOT, ww.slo.TTFT, ww.slo.TPOT)
	fmt.Fprintf(w, "fitting the model: 1 prefill + 1 decode simulated engine, %d requests at each of %v req/s (simulated)\n", x.requests, wl.parsed)
	x.nextLevel = 0
	c, err := x.startCluster(ctx, wl.name+"-fit", 1, 1, r.proxyArgs...)
	if err != nil {
		return err
	}
	const fitTarget = "1P+1D"
	sampler := startLoadSampler(5 * time.Second)
	s, err := x.runWorkload(ctx, []bench.Target{{Name: fitTarget, URL: c.url}}, ww, loadsOf(ww.parsed), 1, x.requests)
	rw.FitLoad = sampler.stop()
	x.stopAll()
	if err != nil {
		return err
	}
	x.noteFailures(s, wl.name+" fit")
	if err := bench.WriteTable(w, s); err != nil {
		return err
	}
	fmt.Fprintf(w, "load average (1 min) during the fit: %s\n", rw.FitLoad)
	if err := writeJSONFile(filepath.Join(x.out, "fit-"+wl.name+".json"), s); err != nil {
		return err
	}
	fmt.Fprintln(w)
	bench.WritePDModelHeader(w)
	m := bench.ModelPD(s, fitTarget, x.maxNumSeqs())
	m.Write(w, ww.slo)
	rw.Model = m
	if r.speed != 1 {
		fmt.Fprintf(w, "  (the model's rates above are wall-clock req/s at --sim-speed %g: divide by %g for the simulated engines' req/s)\n", r.speed, r.speed)
	}
	if m.Unattainable != "" {
		fmt.Fprintf(w, "  the model predicts no goodput (%s): nothing to check for %s\n\n", m.Unattainable, wl.name)
		return nil
	}
	fmt.Fprintln(w)
	for _, n := range r.engines {
		best := m.BestSplit(n)
		ps := bench.SplitsToMeasure(best.P, n, r.neighbours, r.far)
		// The predicted split first, then by distance from it: an
		// interrupted run has measured the splits that matter most.
		slices.SortStableFunc(ps, func(a, b int) int { return cmp.Compare(abs(a-best.P), abs(b-best.P)) })
		fmt.Fprintf(w, "-- %s, N = %d: the model predicts %dP:%dD at %.3g req/s (simulated); measuring %s --\n",
			wl.name, n, best.P, best.D, best.Goodput/r.speed, splitList(ps, n))
		var points []bench.RatioPoint
		at := len(rw.Checks)
		for _, p := range ps {
			pt, err := r.measureSplit(ctx, ww, &m, n, p)
			if err != nil {
				return err
			}
			sp := scalePoint(pt, 1/r.speed)
			fmt.Fprintf(w, "  %dP:%dD: predicted %.3g (%s-bound), measured %s; misses at the first rate missed %s; host %s\n",
				sp.P, sp.D, sp.Predicted, m.SplitLimit(sp.P, sp.D), measuredText(sp), sp.Misses, sp.Host)
			points = append(points, pt)
			// The check so far (in simulated req/s: the model's rates and
			// the measured ones are wall-clock), saved after every split
			// so that an interrupted run keeps what it measured.
			check := scaleCheck(bench.NewRatioCheck(&m, n, points), 1/r.speed)
			rw.Checks = append(rw.Checks[:at], check)
			var partial strings.Builder
			partial.WriteString("\n(partial: the run goes on)\n")
			r.writeChecks(&partial)
			if err := r.save(partial.String()); err != nil {
				return err
			}
		}
		fmt.Fprintf(w, "  → %s\n\n", rw.Checks[at].VerdictText())
	}
	return nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func splitList(ps []int, n int) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%dP:%dD", p, n-p))
	}
	return strings.Join(parts, ", ")
}

func measuredText(pt bench.RatioPoint) string {
	var s string
	switch pt.Bound {
	case "below":
		s = fmt.Sprintf("< %.3g (the lowest rate tried missed)", pt.FirstMiss)
	case "at least":
		s = fmt.Sprintf("≥ %.3g (every rate tried met the goal)", pt.Measured)
	default:
		s = fmt.Sprintf("%.3g (%.3g missed)", pt.Measured, pt.FirstMiss)
	}
	if pt.HostBound {
		s += " HOST-BOUND"
	}
	return s
}

// scaleCheck multiplies every rate of c by f.
func scaleCheck(c bench.RatioCheck, f float64) bench.RatioCheck {
	c.Predicted.Goodput *= f
	c.PredictedMeasured *= f
	c.Curve = append([]bench.Split(nil), c.Curve...)
	for i := range c.Curve {
		c.Curve[i].Goodput *= f
	}
	c.Splits = append([]bench.RatioPoint(nil), c.Splits...)
	for i := range c.Splits {
		c.Splits[i] = scalePoint(c.Splits[i], f)
	}
	c.Best = scalePoint(c.Best, f)
	return c
}

// scalePoint is s with every rate multiplied by f.
func scalePoint(s bench.RatioPoint, f float64) bench.RatioPoint {
	s.Predicted *= f
	s.Measured *= f
	s.FirstMiss *= f
	s.Points = append([]bench.SearchPoint(nil), s.Points...)
	for i := range s.Points {
		p := &s.Points[i]
		p.Rate *= f
		p.Goodput *= f
		p.RequestThroughput *= f
		p.OutputThroughput *= f
	}
	return s
}

// measureSplit starts p prefill and n−p decode engines behind a proxy and
// searches for their goodput rate (wall clock) around the model's
// prediction for the split, watching the host at every rate tried.
func (r *ratioRun) measureSplit(ctx context.Context, wl experimentWorkload, m *bench.PDModel, n, p int) (bench.RatioPoint, error) {
	x := r.x
	d := n - p
	pt := bench.RatioPoint{P: p, D: d, Predicted: m.SplitGoodput(p, d)}
	name := fmt.Sprintf("%s-n%d-%dp%dd", wl.name, n, p, d)
	// Each split is a fresh cluster, so its levels may reuse another
	// cluster's prompts.
	x.nextLevel = 0
	c, err := x.startCluster(ctx, name, p, d, r.proxyArgs...)
	if err != nil {
		return pt, err
	}
	defer x.stopAll()
	levels := map[float64]hostStats{}
	dur := time.Duration(r.levelSecs / r.speed * float64(time.Second)) // wall clock
	cfg := bench.SearchConfig{Target: x.goal, Low: r.searchFrom * pt.Predicted, High: 4 * pt.Predicted, Steps: r.steps,
		Duration: dur, MinRequests: r.minRequests,
		Observe: func(_ string, rate float64) func(*bench.Result) {
			r.watch.mark()
			return func(*bench.Result) { levels[rate] = r.watch.mark() }
		}}
	// Enough requests for the highest rate (and the lower search's).
	requests := max(r.minRequests, int(math.Ceil(cfg.High*dur.Seconds())))
	plan, err := x.plan(ctx, []bench.Target{{Name: name, URL: c.url}}, wl, loadsOf([]float64{pt.Predicted}), 1, requests)
	if err != nil {
		return pt, err
	}
	r.watch.setProxy(c.proxy.cmd.Process.Pid)
	fmt.Fprintf(x.log, "experiment: %s: rate search from %.3g req/s (wall), %v of arrivals per rate\n", name, cfg.Low, dur)
	res, err := bench.SearchRate(ctx, plan, cfg, x.log)
	if err != nil {
		return pt, err
	}
	sr := res[0]
	if sr.MaxRate == 0 {
		// Even half the prediction missed: search once more, lower.
		plan.FirstLevel += len(sr.Points)
		lower := cfg
		lower.Low, lower.High = cfg.Low/8, cfg.Low
		more, err := bench.SearchRate(ctx, plan, lower, x.log)
		if err != nil {
			return pt, err
		}
		lo := more[0]
		lo.Points = append(sr.Points, lo.Points...)
		lo.Results = append(sr.Results, lo.Results...)
		if lo.MaxRate > 0 && lo.FirstMiss == 0 {
			lo.FirstMiss = cfg.Low // it met every rate up to where the first search missed
		}
		sr = lo
	}
	pt.Measured, pt.FirstMiss, pt.Points = sr.MaxRate, sr.FirstMiss, sr.Points
	switch {
	case sr.MaxRate == 0:
		pt.Bound = "below"
	case sr.FirstMiss == 0:
		pt.Bound = "at least"
	default:
		pt.Bound = "search"
	}
	for _, res := range sr.Results {
		x.noteFailures(&bench.Suite{Results: []*bench.Result{res}}, wl.name+" "+name)
		if res.Load.Rate == sr.FirstMiss {
			pt.Misses = bench.CountMisses(res, wl.slo)
		}
	}
	// The level that bounded the search is its first miss (or, when every
	// rate met the goal, the highest rate tried): was the host saturated
	// there?
	bound := sr.FirstMiss
	if bound == 0 {
		bound = sr.MaxRate
	}
	var peak hostStats
	for _, st := range levels {
		peak = peak.max(st)
	}
	at := levels[bound]
	pt.HostBound = at.saturated()
	pt.Host = fmt.Sprintf("at %.3g: %s", bound/r.speed, at)
	fmt.Fprintf(x.log, "experiment: %s: the host over the whole search: %s\n", name, peak)
	return pt, nil
}

// userHZ is the kernel's clock tick for /proc CPU times (USER_HZ, 100 on
// every Linux architecture Go supports but alpha and ia64).
const userHZ = 100

// hostStats is what the host did over a window: the mean busy fraction of
// the machine's cores (/proc/stat) and its highest one-period value, the
// mean CPU (in cores) of the proxy and of this process (the load
// generator), their highest one-period values, and the highest 1-minute
// load average.
type hostStats struct {
	Seconds   float64 `json:"seconds"`
	Busy      float64 `json:"cores_busy"`
	BusyPeak  float64 `json:"cores_busy_peak"`
	Proxy     float64 `json:"proxy_cores"`
	ProxyPeak float64 `json:"proxy_cores_peak"`
	Self      float64 `json:"bench_cores"`
	SelfPeak  float64 `json:"bench_cores_peak"`
	Load      float64 `json:"load1_max"`
}

// saturated says the host was near its limit: its cores at least 85% busy
// on average over the window.
func (h hostStats) saturated() bool { return h.Busy >= 0.85 }

func (h hostStats) max(o hostStats) hostStats {
	return hostStats{Seconds: h.Seconds + o.Seconds, Busy: math.Max(h.Busy, o.Busy), BusyPeak: math.Max(h.BusyPeak, o.BusyPeak),
		Proxy: math.Max(h.Proxy, o.Proxy), ProxyPeak: math.Max(h.ProxyPeak, o.ProxyPeak), Self: math.Max(h.Self, o.Self),
		SelfPeak: math.Max(h.SelfPeak, o.SelfPeak), Load: math.Max(h.Load, o.Load)}
}

func (h hostStats) String() string {
	if h.Seconds == 0 {
		return "not measured"
	}
	return fmt.Sprintf("cores %.0f%% busy (peak %.0f%%), proxy %.2f core (peak %.2f), bench %.2f core (peak %.2f), load ≤ %.1f",
		100*h.Busy, 100*h.BusyPeak, h.Proxy, h.ProxyPeak, h.Self, h.SelfPeak, h.Load)
}

// cpuSample is one reading of the host's and two processes' CPU counters.
type cpuSample struct {
	at                time.Time
	busy, total       uint64 // /proc/stat jiffies, all cores
	proxy, self       uint64 // utime + stime ticks
	proxyOK           bool
	proxyPID          int
	load1             float64
	hostOK, loadKnown bool
}

// hostWatch samples the host every period and sums the samples into
// windows that mark ends.
type hostWatch struct {
	mu       sync.Mutex
	proxyPID int
	prev     cpuSample
	win      hostStats
	sums     struct{ busy, total, proxy, self, wall float64 }
	done     chan struct{}
	wg       sync.WaitGroup
}

func startHostWatch(period time.Duration) *hostWatch {
	h := &hostWatch{done: make(chan struct{})}
	h.prev = h.read()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				h.mu.Lock()
				h.add(h.read())
				h.mu.Unlock()
			case <-h.done:
				return
			}
		}
	}()
	return h
}

func (h *hostWatch) stop() { close(h.done); h.wg.Wait() }

// setProxy watches the proxy process pid from now on.
func (h *hostWatch) setProxy(pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.proxyPID = pid
	h.prev = h.read()
}

// mark ends the current window, returning its stats, and starts the next.
func (h *hostWatch) mark() hostStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.add(h.read())
	st := h.win
	if s := h.sums; s.wall > 0 {
		st.Seconds = s.wall
		if s.total > 0 {
			st.Busy = s.busy / s.total
		}
		st.Proxy, st.Self = s.proxy/s.wall, s.self/s.wall
	}
	h.win, h.sums.busy, h.sums.total, h.sums.proxy, h.sums.self, h.sums.wall = hostStats{}, 0, 0, 0, 0, 0
	return st
}

// add folds the interval from the previous sample to s into the window.
func (h *hostWatch) add(s cpuSample) {
	p := h.prev
	h.prev = s
	dt := s.at.Sub(p.at).Seconds()
	if dt <= 0 {
		return
	}
	h.sums.wall += dt
	if s.hostOK && p.hostOK && s.total > p.total {
		busy, total := float64(s.busy-p.busy), float64(s.total-p.total)
		h.sums.busy += busy
		h.sums.total += total
		h.win.BusyPeak = math.Max(h.win.BusyPeak, busy/total)
	}
	if s.proxyOK && p.proxyOK && s.proxyPID == p.proxyPID && s.proxy >= p.proxy {
		c := float64(s.proxy-p.proxy) / userHZ
		h.sums.proxy += c
		h.win.ProxyPeak = math.Max(h.win.ProxyPeak, c/dt)
	}
	if s.self >= p.self {
		c := float64(s.self-p.self) / userHZ
		h.sums.self += c
		h.win.SelfPeak = math.Max(h.win.SelfPeak, c/dt)
	}
	if s.loadKnown {
		h.win.Load = math.Max(h.win.Load, s.load1)
	}
}

func (h *hostWatch) read() cpuSample {
	s := cpuSample{at: time.Now(), proxyPID: h.proxyPID}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy, s.total, s.hostOK = parseProcStat(string(b))
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		s.self, _ = parsePIDStat(string(b))
	}
	if h.proxyPID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.proxyPID)); err == nil {
			s.proxy, s.proxyOK = parsePIDStat(string(b))
		}
	}
	s.load1, s.loadKnown = loadAvg1()
	return s
}

// parseProcStat reads the aggregate "cpu" line of /proc/stat: busy and
// total jiffies over all cores (idle and iowait are not busy; guest time
// is already in user and nice).
func parseProcStat(s string) (busy, total uint64, ok bool) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest and guest_nice are counted in user and nice
			break
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, true
}

// parsePIDStat reads utime + stime (clock ticks) from /proc/PID/stat; the
// command name in parentheses may hold spaces, so fields count from the
// last ')'.
func parsePIDStat(s string) (ticks uint64, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + st, true
}
