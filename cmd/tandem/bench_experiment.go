package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/experiment"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
)

// runBenchExperiment is `tandem bench experiment pd` (and, for `ratio`,
// runBenchRatio): it starts the configurations to compare on this machine,
// runs the same workloads against each in alternating rounds, stops them
// and writes a report with plots.
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
			"--max-num-batched-tokens chosen by a small sweep on the long workload), the same engine\n"+
			"with a prefill cadence (its --prefill-schedule-interval chosen by a second sweep at that\n"+
			"chunk budget), 1 prefill + 1 decode engine (half the cores each) behind tandem proxy,\n"+
			"and the same pair behind a proxy with the conditional decider (prefill on the decode\n"+
			"engine when the uncached prompt is short). Opt-in (--configs ...,adaptive): the same pair, both engines\n"+
			"--role both, behind a proxy whose planner acts on the workload's SLOs (tandem up with --slo-ttft and\n"+
			"--slo-tpot), started afresh for each workload. Each workload runs open loop (Poisson) at each rate against every\n"+
			"configuration, in alternating rounds, each level with prompts of its own. Every engine gets the tuned\n"+
			"--max-num-batched-tokens.\n\n"+
			"With --engines N every configuration has N engines: colocated is N colocated engines behind the router's\n"+
			"defaults, pd and conditional run at each of --splits, adaptive is N engines --role both (started N/2:N/2)\n"+
			"with the planner acting. The configurations then run one after the other (phases): per workload each on a\n"+
			"cluster of its own, after a warm-up, its rates back to back from the lowest; adaptive once per cell of\n"+
			"--adaptive-ttft-scales × --adaptive-tpot-scales with that cell's objectives, compared there with the best\n"+
			"static configuration (whose cells come from its one run). Writes\n"+
			"report.txt (tables, each configuration's goodput rate and throughput per rate, the TTFT\n"+
			"of every configuration split by the answers' Server-Timing spans, and a P:D model fitted\n"+
			"to the pd configuration's prefill service and decode step times), summary.json,\n"+
			"results-*.json (every request) and plots into --out. Failed requests are listed in the\n"+
			"report and make the command fail.\n\n"+
			"Without --model it creates a random-weight smollm2-135m (bf16) model in the user cache\n"+
			"once and uses it.\n\n")
		fs.PrintDefaults()
	}
	var cfg experiment.PD
	var (
		common    = addExperimentFlags(fs, &cfg.Common, "bench-pd", "directory for the report, JSON and plots", "model directory (default: a random-weight smollm2-135m bf16 model created once in the user cache, as `tandem model init --shape smollm2-135m --dtype bf16` makes it)")
		workloads = fs.String("workloads", "chat,long", "workloads to run: chat and/or long")
		chatRates = fs.String("chat-rates", "1,2,4", "arrival rates (req/s) of the chat workload")
		longRates = fs.String("long-rates", "0.2,0.4,0.6", "arrival rates (req/s) of the long workload")
		mnbtSweep = fs.String("mnbt-sweep", "128,256,512,2048", "colocated --max-num-batched-tokens values to tune over (one value: no tuning)")
		ivSweep   = fs.String("interval-sweep", "2,4,8", "colocated-cadence --prefill-schedule-interval values to tune over at the tuned --max-num-batched-tokens (one value: no tuning)")
		configs   = fs.String("configs", "colocated,colocated-cadence,pd,conditional", "configurations: colocated (one engine, all cores), colocated-cadence (the same with --prefill-schedule-interval), pd (1P+1D, --pd-decider always), conditional (1P+1D, --pd-decider conditional --policy prefix); opt-in: adaptive (1P+1D, every engine --role both, the proxy's planner acting on the workload's SLOs)")
		adaptive  = fs.String("adaptive-proxy-args", "", "adaptive: extra `tandem proxy` flags, space-separated (e.g. \"--plan-window 5m --plan-max-age 1m\": the configurations take turns, so the planner sees only its share of the traffic and its engines' metrics age between its turns)")
		adaptDec  = fs.String("adaptive-decider", proxy.DefaultPDDecider, "adaptive: the proxy's --pd-decider (conditional: the planner's threshold decides every request; priced: each request by its price, the planner's threshold only where it has none)")
		kvMemory  = fs.String("kv-cache-memory", "1GiB", "every engine's --kv-cache-memory (several engines share this machine's RAM; empty: the engine's default)")
		slos      = addWorkloadSLOFlags(fs, "")
	)
	var (
		splits     = fs.String("splits", "", "with --engines: the pd and conditional configurations' P:D splits, e.g. 1:3,2:2,3:1 (default: every split of --engines)")
		adaptTTFT  = fs.String("adaptive-ttft-scales", "1", "with --engines: the adaptive configuration runs once per cell, its planner given the workload's TTFT objective times each of these")
		adaptTPOT  = fs.String("adaptive-tpot-scales", "1", "with --engines: ... and its TPOT objective times each of these (e.g. 0.5,1,2 by 0.5,1,2: nine runs)")
		planWindow = fs.Duration("plan-window", 0, "with --engines: the adaptive planner's --plan-window (default: one level's length at the workload's middle rate)")
		planDwell  = fs.Duration("plan-min-dwell", 0, "with --engines: the adaptive planner's --plan-min-dwell (default: half the window)")
	)
	fs.IntVar(&cfg.Engines, "engines", 0, "engines in every configuration, run one configuration after the other (see above; 0: the 1P+1D comparison, configurations alternating)")
	fs.IntVar(&cfg.AdaptiveStart, "adaptive-start-prefill", 0, "with --engines: the prefill engines the adaptive configuration starts with (0: colocated, its planner adding a prefill pool when it pays; negative: half)")
	fs.IntVar(&cfg.Warmup, "warmup", 0, "with --engines: requests sent to every configuration at the lowest rate before its measured ones, not counted (0: one level's; negative: none)")
	fs.IntVar(&cfg.Requests, "requests", 24, "requests per rate and round")
	fs.IntVar(&cfg.Rounds, "rounds", 2, "rounds per rate; the configurations alternate order")
	fs.IntVar(&cfg.TuneRequests, "tune-requests", 12, "requests per tuning run (long workload at its middle rate)")
	fs.IntVar(&cfg.Threshold, "pd-threshold", 256, "conditional: uncached prompt tokens from which the prefill goes to the prefill engine (the proxy's --pd-threshold)")
	fs.Float64Var(&cfg.Goal, "goal", bench.DefaultGoal, "fraction of requests that must meet both SLOs for a rate to count (the goodput rate)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for prompts, lengths and arrivals")
	fs.IntVar(&cfg.MaxContext, "max-context", 0, "clip requests to this many tokens (default: the model's)")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "limit for each request")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := common.finish(); err != nil {
		return err
	}
	if *kvMemory != "" {
		cfg.EngineArgs = append([]string{"--kv-cache-memory", *kvMemory}, cfg.EngineArgs...)
	}
	var err error
	if cfg.MNBTs, err = parseInts(*mnbtSweep); err != nil {
		return fmt.Errorf("--mnbt-sweep: %w", err)
	}
	if cfg.Intervals, err = parseInts(*ivSweep); err != nil {
		return fmt.Errorf("--interval-sweep: %w", err)
	}
	if cfg.Workloads, err = experimentWorkloads(*workloads, map[string]string{"chat": *chatRates, "long": *longRates}, slos, "--%s-rates"); err != nil {
		return err
	}
	if !slices.Contains(factory.Deciders(), *adaptDec) {
		return fmt.Errorf("--adaptive-decider %q: want one of %v", *adaptDec, factory.Deciders())
	}
	// Before the user's flags, which still win.
	cfg.AdaptiveArgs = append([]string{"--pd-decider", *adaptDec}, strings.Fields(*adaptive)...)
	if cfg.Engines > 0 {
		if cfg.Splits, err = experiment.ParseSplits(*splits, cfg.Engines); err != nil {
			return fmt.Errorf("--splits: %w", err)
		}
		if cfg.AdaptiveTTFTScales, err = parseFloats(*adaptTTFT); err != nil {
			return fmt.Errorf("--adaptive-ttft-scales: %w", err)
		}
		if cfg.AdaptiveTPOTScales, err = parseFloats(*adaptTPOT); err != nil {
			return fmt.Errorf("--adaptive-tpot-scales: %w", err)
		}
		cfg.PlanWindow, cfg.PlanMinDwell = *planWindow, *planDwell
	} else if *splits != "" || *adaptTTFT != "1" || *adaptTPOT != "1" || *planWindow != 0 || *planDwell != 0 || cfg.Warmup != 0 || cfg.AdaptiveStart != 0 {
		return errors.New("--splits, --adaptive-ttft-scales, --adaptive-tpot-scales, --adaptive-start-prefill, --plan-window, --plan-min-dwell and --warmup need --engines N")
	}
	for c := range strings.SplitSeq(*configs, ",") {
		cfg.Configs = append(cfg.Configs, strings.TrimSpace(c))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return experiment.RunPD(ctx, cfg)
}

// experimentFlags are the flags every experiment and the soak share.
type experimentFlags struct {
	common   *experiment.Common
	extra    *string
	progress *progress.Flags
}

// addExperimentFlags defines --model, --out (default out), --engine-args
// and the progress flags on fs for c; finish fills in the rest of c after
// parsing.
func addExperimentFlags(fs *flag.FlagSet, c *experiment.Common, out, outHelp, modelHelp string) experimentFlags {
	fs.StringVar(&c.Model, "model", "", modelHelp)
	fs.StringVar(&c.Out, "out", out, outHelp)
	pf := &progress.Flags{Every: 10 * time.Second}
	pf.Register(fs)
	return experimentFlags{common: c, extra: fs.String("engine-args", "", "extra `tandem serve` flags for every engine, space-separated"), progress: pf}
}

// finish sets the engine arguments and the executable the processes run.
func (f experimentFlags) finish() error {
	f.common.EngineArgs = strings.Fields(*f.extra)
	f.common.Progress = f.progress.New(os.Stderr)
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the tandem executable to start the engines with: %w", err)
	}
	f.common.Executable = exe
	return nil
}

// experimentWorkloads picks the workloads a --workloads list names (chat,
// long), each with its rates parsed from rates[name] and its SLO; rateFlag
// names a workload's rates flag in errors ("--%s-rates").
func experimentWorkloads(list string, rates map[string]string, slos workloadSLOs, rateFlag string) ([]experiment.Workload, error) {
	sloOf := map[string]bench.SLO{"chat": slos.chat(), "long": slos.long()}
	var out []experiment.Workload
	for w := range strings.SplitSeq(list, ",") {
		name := strings.TrimSpace(w)
		slo, ok := sloOf[name]
		if !ok {
			return nil, fmt.Errorf("--workloads: unknown workload %q (want chat, long)", w)
		}
		rs, err := parseFloats(rates[name])
		if err != nil {
			return nil, fmt.Errorf(rateFlag+": %w", name, err)
		}
		out = append(out, experiment.Workload{Name: name, Rates: rs, SLO: slo})
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
