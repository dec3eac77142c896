package experiment

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/hoststat"
)

// SimBuiltin is Ratio.Simulate for the built-in time model.
const SimBuiltin = "builtin"

// Ratio configures the ratio experiment, `tandem bench experiment ratio`.
// Its rates and SLOs are in simulated time: with Speed S the engines run S
// times faster than real time, arrivals are sent S times faster and the
// SLOs are divided by S.
type Ratio struct {
	// Common's Model gives the simulated engines their tokenizer and KV
	// shape; empty is the embedded default model, as `tandem up --simulate`
	// uses.
	Common
	// Simulate is the simulated engines' time model: SimBuiltin or a
	// profile from `tandem profile`.
	Simulate string
	// Speed runs the simulated engines this many times faster than real
	// time.
	Speed float64
	// MaxModelLen is every simulated engine's --max-model-len.
	MaxModelLen int
	// Engines are the numbers of engines N to check the model at.
	Engines []int
	// Workloads are fitted and checked in order; their rates are the 1P+1D
	// fitting run's.
	Workloads []Workload
	// FitRequests is the requests per rate of the fitting run.
	FitRequests int
	// LevelSeconds of arrivals per rate tried (a level sends
	// max(MinRequests, rate × LevelSeconds) requests).
	LevelSeconds float64
	MinRequests  int
	// Neighbours is how many splits are measured on either side of the
	// predicted best; Far adds N/2 and the quarter on the other side.
	Neighbours int
	Far        bool
	// SearchFrom is the fraction of the model's rate for a split where its
	// rate search starts; Steps the bisection steps after the bracket.
	SearchFrom float64
	Steps      int
	// ProxyArgs are extra `tandem proxy` flags.
	ProxyArgs []string
	// Goal is the fraction of requests that must meet both SLOs for a rate
	// to count.
	Goal float64
	Seed uint64
	// Timeout limits each request (wall clock).
	Timeout time.Duration
}

func (c *Ratio) check() error {
	if err := checkGoal(c.Goal); err != nil {
		return err
	}
	switch {
	case !(c.Speed > 0):
		return fmt.Errorf("--sim-speed %v must be positive", c.Speed)
	case c.LevelSeconds <= 0 || c.MinRequests < 1 || c.FitRequests < 1 || c.Neighbours < 0 || c.Steps < 0 || c.SearchFrom <= 0 || c.SearchFrom > 4:
		return errors.New("--level-seconds, --min-requests and --fit-requests must be positive, --neighbours and --search-steps not negative, --search-from in (0, 4]")
	}
	for _, n := range c.Engines {
		if n < 2 {
			return fmt.Errorf("--engines %d: a split needs at least 2 engines", n)
		}
	}
	return nil
}

// ratioRun is one run of the ratio experiment. Its experiment starts the
// processes and builds the workloads; its rates and SLOs are wall-clock
// ones (the config's simulated ones scaled by speed).
type ratioRun struct {
	*experiment
	cfg    Ratio
	watch  *hoststat.Watch
	report strings.Builder // what the report says so far
	sum    RatioSummary
}

// RatioSummary is the ratio experiment's summary.json.
type RatioSummary struct {
	Simulate  string          `json:"simulate"`
	Speed     float64         `json:"sim_speed"`
	Model     string          `json:"model"`
	CPUs      []int           `json:"cpus"`
	Engines   []int           `json:"engines"`
	Goal      float64         `json:"goal"`
	Started   time.Time       `json:"started"`
	Finished  time.Time       `json:"finished"`
	Workloads []RatioWorkload `json:"workloads"`
	Failed    []string        `json:"failed,omitempty"`
}

// RatioWorkload is one workload's fit and checks. Rates in Model are
// wall-clock requests/s, those of Checks simulated ones (wall ÷ speed).
type RatioWorkload struct {
	Name     string             `json:"name"`
	SLO      bench.SLO          `json:"slo_simulated"`
	FitRates []float64          `json:"fit_rates_simulated"`
	FitLoad  hoststat.LoadStats `json:"fit_load_average"`
	Model    bench.PDModel      `json:"model_wall_clock"`
	Checks   []bench.RatioCheck `json:"checks_simulated_rates"`
}

// RunRatio checks the P:D model of the P/D experiment on simulated
// engines. It fits the model to a 1P+1D simulated run of each workload,
// then for each N measures the goodput rate of several P:D splits of N
// simulated engines behind a tandem proxy (the predicted best, its
// neighbours, and far ones) with a rate search, and reports the prediction
// against the measurement: report.txt, summary.json and ratio.png/svg in
// cfg.Out, saved after every split.
func RunRatio(ctx context.Context, cfg Ratio) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.Model == "" {
		dir, err := defaultmodel.Install("")
		if err != nil {
			return err
		}
		cfg.Model = dir
	}
	sim := "--simulate"
	if cfg.Simulate != SimBuiltin {
		abs, err := filepath.Abs(cfg.Simulate)
		if err != nil {
			return err
		}
		sim = "--simulate=" + abs
	}
	cfg.EngineArgs = append([]string{sim, "--sim-speed", strconv.FormatFloat(cfg.Speed, 'g', -1, 64), "--max-model-len", strconv.Itoa(cfg.MaxModelLen)}, cfg.EngineArgs...)
	x, err := newExperiment(&cfg.Common, cfg.Goal)
	if err != nil {
		return err
	}
	x.requests, x.rounds, x.seed, x.timeout = cfg.FitRequests, 1, cfg.Seed, cfg.Timeout
	defer x.stopAll()
	r := &ratioRun{experiment: x, cfg: cfg}
	return r.run(ctx)
}

func (r *ratioRun) run(ctx context.Context) error {
	x, cfg := r.experiment, r.cfg
	r.watch = hoststat.StartWatch(time.Second, "bench")
	defer r.watch.Stop()
	w := io.MultiWriter(&r.report, cfg.Stdout)
	r.sum = RatioSummary{Simulate: cfg.Simulate, Speed: cfg.Speed, Model: x.model, CPUs: x.cpus, Engines: cfg.Engines, Goal: x.goal, Started: time.Now()}
	fmt.Fprintf(w, "tandem bench experiment ratio: simulated engines (--simulate %s, --sim-speed %g), tokenizer and KV shape of %s, %d CPUs %v, %s, started %s\n",
		cfg.Simulate, cfg.Speed, x.model, len(x.cpus), x.cpus, runtime.Version(), time.Now().Format(time.DateTime))
	fmt.Fprintf(w, "engines N: %v; each split of N is a fresh cluster of simulated engines (%s) behind a tandem proxy process %v; goal %.0f%% of requests meeting both SLOs\n",
		cfg.Engines, strings.Join(x.extra, " "), cfg.ProxyArgs, 100*x.goal)
	fmt.Fprintf(w, "load average (1 min) at the start: %s\n\n", hoststat.LoadAvgText())
	for _, wl := range cfg.Workloads {
		r.sum.Workloads = append(r.sum.Workloads, RatioWorkload{Name: wl.Name, SLO: wl.SLO, FitRates: wl.Rates})
		if err := r.runWorkload(ctx, w, wl, &r.sum.Workloads[len(r.sum.Workloads)-1]); err != nil {
			return err
		}
	}
	var tail strings.Builder
	tw := io.MultiWriter(&tail, cfg.Stdout)
	r.writeChecks(tw)
	x.writeFailures(tw)
	r.sum.Finished = time.Now()
	if err := r.save(tail.String()); err != nil {
		return err
	}
	return x.failure()
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
	fmt.Fprintf(w, "plot: %s\n", filepath.Join(r.out, "ratio.png"))
	fmt.Fprintf(w, "load average (1 min) now: %s\n", hoststat.LoadAvgText())
}

// save writes report.txt (the report so far, then tail), summary.json and
// the plot: after every check, so that an interrupted run keeps what it
// measured.
func (r *ratioRun) save(tail string) error {
	r.sum.Failed = r.failed
	if err := bench.WriteJSONFile(filepath.Join(r.out, "summary.json"), r.sum); err != nil {
		return err
	}
	if _, err := plot.Ratio(r.out, "ratio", r.checks(), 1); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.out, "report.txt"), []byte(r.report.String()+tail), 0o644)
}

func (r *ratioRun) wallNote() string {
	if r.cfg.Speed == 1 {
		return ""
	}
	return fmt.Sprintf("; wall-clock req/s are %g times these", r.cfg.Speed)
}

// wall is wl with its rates and SLOs in wall-clock time.
func (r *ratioRun) wall(wl Workload) Workload {
	out := wl
	out.SLO = wl.SLO.Scale(1 / r.cfg.Speed)
	out.Rates = nil
	for _, v := range wl.Rates {
		out.Rates = append(out.Rates, v*r.cfg.Speed)
	}
	return out
}

// runWorkload fits the model to a 1P+1D run of wl and checks it at every N.
func (r *ratioRun) runWorkload(ctx context.Context, w io.Writer, wl Workload, rw *RatioWorkload) error {
	x, speed := r.experiment, r.cfg.Speed
	ww := r.wall(wl)
	fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v (simulated; wall clock %v and %v) ==\n", wl.Name, wl.SLO.TTFT, wl.SLO.TPOT, ww.SLO.TTFT, ww.SLO.TPOT)
	fmt.Fprintf(w, "fitting the model: 1 prefill + 1 decode simulated engine, %d requests at each of %v req/s (simulated)\n", x.requests, wl.Rates)
	x.nextLevel = 0
	c, err := x.startCluster(ctx, x.model, filepath.Base(x.model), wl.Name+"-fit", 1, 1, r.cfg.ProxyArgs...)
	if err != nil {
		return err
	}
	const fitTarget = "1P+1D"
	sampler := hoststat.StartLoadSampler(5 * time.Second)
	s, err := x.runWorkload(ctx, []bench.Target{{Name: fitTarget, URL: c.url}}, ww, loadsOf(ww.Rates), 1, x.requests)
	rw.FitLoad = sampler.Stop()
	x.stopAll()
	if err != nil {
		return err
	}
	x.noteFailures(s, wl.Name+" fit")
	if err := bench.WriteTable(w, s); err != nil {
		return err
	}
	fmt.Fprintf(w, "load average (1 min) during the fit: %s\n", rw.FitLoad)
	if err := bench.WriteJSONFile(filepath.Join(x.out, "fit-"+wl.Name+".json"), s); err != nil {
		return err
	}
	fmt.Fprintln(w)
	bench.WritePDModelHeader(w)
	m := bench.ModelPD(s, fitTarget, x.maxNumSeqs())
	m.Write(w, ww.SLO)
	rw.Model = m
	if speed != 1 {
		fmt.Fprintf(w, "  (the model's rates above are wall-clock req/s at --sim-speed %g: divide by %g for the simulated engines' req/s)\n", speed, speed)
	}
	if m.Unattainable != "" {
		fmt.Fprintf(w, "  the model predicts no goodput (%s): nothing to check for %s\n\n", m.Unattainable, wl.Name)
		return nil
	}
	fmt.Fprintln(w)
	for _, n := range r.cfg.Engines {
		best := m.BestSplit(n)
		ps := bench.SplitsToMeasure(best.P, n, r.cfg.Neighbours, r.cfg.Far)
		// The predicted split first, then by distance from it: an
		// interrupted run has measured the splits that matter most.
		slices.SortStableFunc(ps, func(a, b int) int { return cmp.Compare(abs(a-best.P), abs(b-best.P)) })
		fmt.Fprintf(w, "-- %s, N = %d: the model predicts %dP:%dD at %.3g req/s (simulated); measuring %s --\n",
			wl.Name, n, best.P, best.D, best.Goodput/speed, splitList(ps, n))
		var points []bench.RatioPoint
		at := len(rw.Checks)
		for _, p := range ps {
			pt, err := r.measureSplit(ctx, ww, &m, n, p)
			if err != nil {
				return err
			}
			sp := scalePoint(pt, 1/speed)
			fmt.Fprintf(w, "  %dP:%dD: predicted %.3g (%s-bound), measured %s; misses at the first rate missed %s; host %s\n",
				sp.P, sp.D, sp.Predicted, m.SplitLimit(sp.P, sp.D), measuredText(sp), sp.Misses, sp.Host)
			points = append(points, pt)
			// The check so far (in simulated req/s: the model's rates and
			// the measured ones are wall-clock), saved after every split
			// so that an interrupted run keeps what it measured.
			check := scaleCheck(bench.NewRatioCheck(&m, n, points), 1/speed)
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

// measureSplit starts p prefill and n−p decode engines behind a proxy and
// searches for their goodput rate (wall clock) around the model's
// prediction for the split, watching the host at every rate tried.
func (r *ratioRun) measureSplit(ctx context.Context, wl Workload, m *bench.PDModel, n, p int) (bench.RatioPoint, error) {
	x, cfg := r.experiment, r.cfg
	d := n - p
	pt := bench.RatioPoint{P: p, D: d, Predicted: m.SplitGoodput(p, d)}
	name := fmt.Sprintf("%s-n%d-%dp%dd", wl.Name, n, p, d)
	// Each split is a fresh cluster, so its levels may reuse another
	// cluster's prompts.
	x.nextLevel = 0
	c, err := x.startCluster(ctx, x.model, filepath.Base(x.model), name, p, d, cfg.ProxyArgs...)
	if err != nil {
		return pt, err
	}
	defer x.stopAll()
	levels := map[float64]hoststat.Stats{}
	dur := time.Duration(cfg.LevelSeconds / cfg.Speed * float64(time.Second)) // wall clock
	search := bench.SearchConfig{Target: x.goal, Low: cfg.SearchFrom * pt.Predicted, High: 4 * pt.Predicted, Steps: cfg.Steps,
		Duration: dur, MinRequests: cfg.MinRequests,
		Observe: func(_ string, rate float64) func(*bench.Result) {
			r.watch.Mark()
			return func(*bench.Result) { levels[rate] = r.watch.Mark() }
		}}
	// Enough requests for the highest rate (and the lower search's).
	requests := max(cfg.MinRequests, int(math.Ceil(search.High*dur.Seconds())))
	plan, err := x.plan(ctx, []bench.Target{{Name: name, URL: c.url}}, wl, loadsOf([]float64{pt.Predicted}), 1, requests)
	if err != nil {
		return pt, err
	}
	r.watch.SetProcess("proxy", c.proxy.PID())
	x.logf("%s: rate search from %.3g req/s (wall), %v of arrivals per rate", name, search.Low, dur)
	res, err := bench.SearchRate(ctx, plan, search, x.log)
	if err != nil {
		return pt, err
	}
	sr := res[0]
	if sr.MaxRate == 0 {
		// Even half the prediction missed: search once more, lower.
		plan.FirstLevel += len(sr.Points)
		lower := search
		lower.Low, lower.High = search.Low/8, search.Low
		more, err := bench.SearchRate(ctx, plan, lower, x.log)
		if err != nil {
			return pt, err
		}
		lo := more[0]
		lo.Points = append(sr.Points, lo.Points...)
		lo.Results = append(sr.Results, lo.Results...)
		if lo.MaxRate > 0 && lo.FirstMiss == 0 {
			lo.FirstMiss = search.Low // it met every rate up to where the first search missed
		}
		sr = lo
	}
	pt.Measured, pt.FirstMiss, pt.Points, pt.Bound = sr.MaxRate, sr.FirstMiss, sr.Points, sr.Bound()
	for _, res := range sr.Results {
		x.noteFailures(&bench.Suite{Results: []*bench.Result{res}}, wl.Name+" "+name)
		if res.Load.Rate == sr.FirstMiss {
			pt.Misses = bench.CountMisses(res, wl.SLO)
		}
	}
	// The level that bounded the search is its first miss (or, when every
	// rate met the goal, the highest rate tried): was the host saturated
	// there?
	bound := sr.FirstMiss
	if bound == 0 {
		bound = sr.MaxRate
	}
	var peak hoststat.Stats
	for _, st := range levels {
		peak = peak.Max(st)
	}
	at := levels[bound]
	pt.HostBound = at.Saturated()
	pt.Host = fmt.Sprintf("at %.3g: %s", bound/cfg.Speed, at)
	x.logf("%s: the host over the whole search: %s", name, peak)
	return pt, nil
}
