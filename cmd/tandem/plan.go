package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
)

// plannerFlags are the planner's flags, shared by tandem proxy and tandem
// up: the objectives turn it on.
type plannerFlags struct {
	cfg planner.Config
}

func registerPlannerFlags(fs *flag.FlagSet) *plannerFlags {
	f := &plannerFlags{}
	fs.DurationVar(&f.cfg.TTFT, "slo-ttft", 0, "planner: the time-to-first-token objective; with --slo-tpot it turns the planner on, which sizes the prefill and decode pools and the conditional threshold from the traffic (GET "+proxy.PlanPath+", tandem plan, tandem:planner_* metrics)")
	fs.DurationVar(&f.cfg.TPOT, "slo-tpot", 0, "planner: the time-per-output-token objective (with --slo-ttft)")
	fs.Float64Var(&f.cfg.Goal, "slo-goal", 0.9, "planner: the fraction of requests that must meet both objectives")
	fs.DurationVar(&f.cfg.MinDwell, "plan-min-dwell", 30*time.Second, "planner: the least time between two changes of the split")
	fs.Float64Var(&f.cfg.Hysteresis, "plan-hysteresis", 0.1, "planner: how much more goodput (a fraction) a new split must be predicted before the split moves")
	fs.DurationVar(&f.cfg.MaxAge, "plan-max-age", 10*time.Second, "planner: engine metrics older than this are stale and ignored (a decision without fresh ones holds the split and says so)")
	fs.DurationVar(&f.cfg.Window, "plan-window", time.Minute, "planner: how far back the traffic and costs are fitted")
	fs.IntVar(&f.cfg.MaxSeqs, "plan-max-num-seqs", 64, "planner: the decode engines' --max-num-seqs")
	fs.IntVar(&f.cfg.MaxBatchedTokens, "plan-max-num-batched-tokens", 2048, "planner: the decode engines' --max-num-batched-tokens, the chunk their local prefills stall their streams by (engines that publish tandem:engine_info tell the planner theirs)")
	return f
}

// config is the planner's configuration, nil when the planner is off.
func (f *plannerFlags) config() (*planner.Config, error) {
	switch {
	case f.cfg.TTFT == 0 && f.cfg.TPOT == 0:
		return nil, nil
	case f.cfg.TTFT <= 0 || f.cfg.TPOT <= 0:
		return nil, errors.New("the planner needs both objectives: give --slo-ttft and --slo-tpot")
	case f.cfg.Goal <= 0 || f.cfg.Goal >= 1:
		return nil, fmt.Errorf("--slo-goal %v: want a fraction in (0, 1)", f.cfg.Goal)
	}
	c := f.cfg
	return &c, nil
}

// runPlan is `tandem plan`: the planner's decision and the numbers behind
// it, from a running proxy or from a saved bench run.
func runPlan(args []string) error { return plan(os.Stdout, args) }

func plan(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("tandem plan", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem plan [--url URL] | tandem plan --run FILE.json --target NAME --engines N [--slo-ttft D --slo-tpot D]\n\n"+
			"Prints the planner's decision — the P:D split, the conditional threshold, the prefill cadence — and the\n"+
			"numbers behind it: from a running tandem proxy or tandem up started with --slo-ttft and --slo-tpot (GET\n"+
			"%s), or, with --run, from a saved run of tandem bench --json (the model tandem bench report\n"+
			"--pd-model fits, and its best split of --engines).\n\n", proxy.PlanPath)
		fs.PrintDefaults()
	}
	var (
		url     = fs.String("url", "http://127.0.0.1:8000", "the proxy")
		run     = fs.String("run", "", "a saved run (tandem bench --json, or an experiment's results-*.json) to plan from instead of a proxy")
		target  = fs.String("target", "pd", "with --run: the disaggregated target whose requests the model is fitted to")
		engines = fs.Int("engines", 8, "with --run: the engines to split")
		ttft    = fs.Duration("slo-ttft", 0, "with --run: the TTFT objective (default: the run's)")
		tpot    = fs.Duration("slo-tpot", 0, "with --run: the TPOT objective (default: the run's)")
		seqs    = fs.Int("max-num-seqs", 64, "with --run: the decode engines' --max-num-seqs")
		asJSON  = fs.Bool("json", false, "print the proxy's answer as JSON")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *run != "" {
		return planFromRun(out, *run, *target, *engines, *ttft, *tpot, *seqs)
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimRight(*url, "/")+proxy.PlanPath, nil)
	if err != nil {
		return fmt.Errorf("--url %s: %w", *url, err)
	}
	if key := os.Getenv(openai.APIKeyEnv); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("asking the proxy for its plan: %w (is it running? give its address with --url)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the proxy's plan: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the proxy answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if *asJSON {
		_, err := out.Write(body)
		return err
	}
	var p planAnswer
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("the proxy's plan: %w", err)
	}
	writePlan(out, p)
	return nil
}

// planAnswer is the JSON of proxy.PlanPath, as this command reads it.
type planAnswer struct {
	Decision   *planner.Decision `json:"decision"`
	Acting     bool              `json:"acting"`
	Moving     string            `json:"moving"`
	Prefill    []string          `json:"prefill"`
	Decode     []string          `json:"decode"`
	Pinned     map[string]string `json:"pinned"`
	Finishing  map[string]string `json:"finishing"`
	Objectives map[string]any    `json:"objectives"`
	Cadence    *planCadence      `json:"cadence"`
	Decider    *planDecider      `json:"decider"`
}

// planDecider is what the proxy's disaggregation decider did with the
// planner's window of requests.
type planDecider struct {
	Name        string `json:"name"`
	Threshold   string `json:"threshold"`
	Requests    int    `json:"requests"`
	Remote      int    `json:"remote"`
	ByThreshold int    `json:"by_threshold"`
}

// planCadence is the prefill cadence an acting planner set on the decode
// pool's engines.
type planCadence struct {
	PrefillScheduleInterval int               `json:"prefill_schedule_interval"`
	Applied                 map[string]int    `json:"applied"`
	Failed                  map[string]string `json:"failed"`
}

func writePlan(w io.Writer, p planAnswer) {
	o := p.Objectives
	fmt.Fprintf(w, "objectives: TTFT %v, TPOT %v, goal %v; window %v, metrics stale after %v, dwell %v, hysteresis %v\n",
		o["ttft"], o["tpot"], o["goal"], o["window"], o["max_age"], o["min_dwell"], o["hysteresis"])
	mode := "publishing only (metrics, Kubernetes scaling)"
	if p.Acting {
		mode = "moving engines between the pools"
	}
	fmt.Fprintf(w, "pools now: %d prefill, %d decode; %s\n", len(p.Prefill), len(p.Decode), mode)
	if p.Moving != "" {
		fmt.Fprintf(w, "moving: %s\n", p.Moving)
	}
	for _, u := range slices.Sorted(maps.Keys(p.Finishing)) {
		fmt.Fprintf(w, "finishing: %s: moved %s, its old role's work still running\n", u, p.Finishing[u])
	}
	for _, u := range slices.Sorted(maps.Keys(p.Pinned)) {
		fmt.Fprintf(w, "pinned: %s: %s\n", u, p.Pinned[u])
	}
	d := p.Decision
	if d == nil {
		fmt.Fprintln(w, "no decision yet (the first comes one --plan-interval after the start)")
		return
	}
	fmt.Fprintf(w, "decision at %s: %d prefill + %d decode", d.At.Format(time.RFC3339), d.Prefill, d.Decode)
	if d.Changed {
		fmt.Fprint(w, " (changed)")
	}
	if d.Crossed {
		fmt.Fprint(w, " (straight to the best: the step toward it predicts less than now)")
	}
	fmt.Fprintf(w, "; best %dP:%dD; conditional threshold %d uncached tokens; prefill cadence %d\n", d.Best.P, d.Best.D, d.Threshold, d.PrefillScheduleInterval)
	writeDecider(w, p.Decider, d)
	if d.Held != "" {
		fmt.Fprintf(w, "held: %s\n", d.Held)
	}
	if d.Settling != "" && d.Settling != d.Held {
		// The split is at the best, but the last move is not measured yet.
		fmt.Fprintf(w, "%s\n", d.Settling)
	}
	if c := p.Cadence; c != nil && c.PrefillScheduleInterval > 0 {
		set := 0
		for _, u := range p.Decode {
			if c.Applied[u] == c.PrefillScheduleInterval {
				set++
			}
		}
		fmt.Fprintf(w, "prefill cadence %d set on %d of the %d decode engines\n", c.PrefillScheduleInterval, set, len(p.Decode))
		for _, u := range slices.Sorted(maps.Keys(c.Failed)) {
			fmt.Fprintf(w, "  not set on %s: %s\n", u, c.Failed[u])
		}
	}
	if d.Fit.Shift != "" {
		fmt.Fprintf(w, "shift: %s\n", d.Fit.Shift)
	}
	writeFit(w, d)
}

// writeDecider says what the threshold is to the proxy's decider and what
// the decider did with the window's requests, beside the model's remote
// share at the threshold.
func writeDecider(w io.Writer, dec *planDecider, d *planner.Decision) {
	if dec == nil || dec.Name == "" {
		return
	}
	switch dec.Threshold {
	case "fallback":
		fmt.Fprintf(w, "decider %s: each request by its price from the engines' measured costs; the threshold is informational (the split is valued at it) and decides only the requests it cannot price yet or serve within the objectives either way", dec.Name)
	case "decides":
		fmt.Fprintf(w, "decider %s: every request by the threshold", dec.Name)
	default:
		fmt.Fprintf(w, "decider %s: the threshold is informational, the decider does not use it", dec.Name)
	}
	if dec.Requests > 0 {
		fmt.Fprintf(w, "; in the window %d requests, %.0f%% prefilled remotely (the model: %.0f%% at the threshold)",
			dec.Requests, 100*float64(dec.Remote)/float64(dec.Requests), 100*d.Fit.RemoteFraction)
		if dec.Threshold == "fallback" {
			fmt.Fprintf(w, ", %d by the threshold", dec.ByThreshold)
		}
	}
	fmt.Fprintln(w)
}

func writeFit(w io.Writer, d *planner.Decision) {
	f := d.Fit
	fmt.Fprintf(w, "traffic: %d requests, %.2f req/s (index of dispersion %.2f, largest burst %d); mean prompt %.0f tokens (%.0f uncached), output %.0f (%d finished); %.0f%% prefilled remotely at the threshold\n",
		f.Requests, f.ArrivalRate, f.ArrivalDispersion, f.BurstRequests, f.MeanPrompt, f.MeanUncached, f.MeanOutput, f.FinishedOutputs, 100*f.RemoteFraction)
	fmt.Fprintf(w, "engines: %d with fresh metrics (%d stale samples ignored)\n", f.FreshEngines, f.StaleSamples)
	if c := f.Prefill; c.B > 0 || c.C > 0 || c.A > 0 {
		fmt.Fprintf(w, "prefill (%s", c.Source)
		if c.Samples > 0 {
			fmt.Fprintf(w, ", %d samples", c.Samples)
		}
		fmt.Fprintf(w, "): %.2f ms + %.4f ms/token + %.3g ms/token² (%.0f ms at 128 tokens, %.0f at 1024; scraped %.3f ms/token) → s̄ = %.3f s, C² = %.3f, overhead %.3f s",
			1000*c.A, 1000*c.B, 1000*c.C, 1000*c.Seconds(128), 1000*c.Seconds(1024), 1000*f.PrefillSecondsPerToken, f.PrefillSeconds, f.PrefillCV2, f.Overhead)
		if f.PrefillTooLong > 0 {
			fmt.Fprintf(w, "; %.0f%% of the remote prompts miss the TTFT alone", 100*f.PrefillTooLong)
		}
		fmt.Fprintln(w)
	}
	if f.DecodeFit != "" {
		p := f.StepP
		if p <= 0 {
			p = 1
		}
		fmt.Fprintf(w, "decode (%s, %d points, batches %.1f–%.1f, mean %.1f): TPOT = %.2f + %.2f·k^%.2f ms (σ %.1f, slope ± %.2f s.e.; %.1f ms at batch 1, %.1f at 16, %.1f at 32; past batch %.1f the prior's shape or the upper slope) → batch %.1f at %.1f ms → %.3f req/s per engine within the TPOT; decode leg %.1f ms\n",
			f.DecodeFit, f.DecodePoints, f.StepBatchMin, f.StepBatchMax, f.MeanBatch, f.StepA, f.StepB, p, f.StepSigma, f.StepBSE, f.StepMs(1), f.StepMs(16), f.StepMs(32), f.StepBatchMax,
			f.DecodeBatch, f.DecodeTPOT, f.DecodeRate, 1000*f.DecodeLeg)
	}
	if f.Current.P+f.Current.D > 0 {
		fmt.Fprintf(w, "predicted goodput: now %dP:%dD %.2f req/s (%s-bound); best %dP:%dD %.2f req/s (%s-bound)\n",
			f.Current.P, f.Current.D, f.Current.Goodput, f.Current.Limit, d.Best.P, d.Best.D, d.Best.Goodput, d.Best.Limit)
	}
	if len(d.Splits) > 0 {
		fmt.Fprint(w, "splits (predicted goodput at each one's best threshold):")
		for _, s := range d.Splits {
			th := "every prompt local"
			if s.P > 0 {
				th = fmt.Sprintf("threshold %d", s.Threshold)
			}
			fmt.Fprintf(w, " %dP:%dD %.2f req/s (%s, %s-bound);", s.P, s.D, s.Goodput, th, s.Limit)
		}
		fmt.Fprintln(w)
	}
	if f.Unattainable != "" {
		fmt.Fprintf(w, "unattainable: %s\n", f.Unattainable)
	}
}

// planFromRun fits the P:D model to a saved run, as tandem bench report
// --pd-model does, and prints its best split of engines.
func planFromRun(out io.Writer, path, target string, engines int, ttft, tpot time.Duration, seqs int) error {
	if engines < 2 {
		return fmt.Errorf("--engines %d: want at least 2 (one of each role)", engines)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	s, err := bench.ReadSuite(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	slo := s.Plan.SLO
	if ttft > 0 {
		slo.TTFT = ttft
	}
	if tpot > 0 {
		slo.TPOT = tpot
	}
	s.Rescore(slo, 0)
	bench.WritePDModelHeader(out)
	m := bench.ModelPD(s, target, seqs)
	m.Write(out, s.Plan.SLO)
	if m.Unattainable != "" {
		return nil
	}
	b := m.BestSplit(engines)
	fmt.Fprintf(out, "decision: %d prefill + %d decode of %d engines, %.2f req/s predicted (%s-bound)\n", b.P, b.D, engines, b.Goodput, m.SplitLimit(b.P, b.D))
	return nil
}
