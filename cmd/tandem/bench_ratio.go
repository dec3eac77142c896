package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// runBenchRatio is `tandem bench experiment ratio`: it checks the P:D model
// of `tandem bench experiment pd` on simulated engines (experiment.RunRatio).
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
	var cfg experiment.Ratio
	var (
		common     = addExperimentFlags(fs, &cfg.Common, "bench-ratio", "directory for the report, JSON, plot and logs", "model directory giving the simulated engines their tokenizer and KV shape (default: the embedded stories260K, as tandem up --simulate uses)")
		engines    = fs.String("engines", "8,16", "numbers of engines N to check the model at (e.g. 8,16,32)")
		workloads  = fs.String("workloads", "chat", "workloads: chat and/or long (as tandem bench experiment pd defines them)")
		chatRates  = fs.String("fit-chat-rates", "1,2,4", "arrival rates (req/s, simulated) of the chat workload's 1P+1D fitting run")
		longRates  = fs.String("fit-long-rates", "0.1,0.2,0.3", "arrival rates (req/s, simulated) of the long workload's 1P+1D fitting run")
		slos       = addWorkloadSLOFlags(fs, " (simulated time)")
		proxyExtra = fs.String("proxy-args", "", "extra `tandem proxy` flags, space-separated (default policy: round-robin)")
	)
	fs.StringVar(&cfg.Simulate, "simulate", simBuiltin, "time model of the simulated engines: builtin (a 135M model measured on a 2-core EPYC) or a profile from tandem profile")
	fs.Float64Var(&cfg.Speed, "sim-speed", 1, "run the simulated engines this many times faster than real time (below 1 when the host cannot keep up)")
	fs.IntVar(&cfg.FitRequests, "fit-requests", 48, "requests per rate of the fitting run")
	fs.Float64Var(&cfg.LevelSeconds, "level-seconds", 30, "simulated seconds of Poisson arrivals per rate tried: a level sends max(--min-requests, rate × this) requests")
	fs.IntVar(&cfg.MinRequests, "min-requests", 30, "fewest requests per rate tried")
	fs.IntVar(&cfg.Neighbours, "neighbours", 1, "splits measured on either side of the predicted best")
	fs.BoolVar(&cfg.Far, "far", true, "also measure splits far from the prediction: N/2 and the quarter on the other side (N/4 or 3N/4)")
	fs.Float64Var(&cfg.SearchFrom, "search-from", 0.6, "each split's rate search starts at this fraction of the model's rate for the split, doubles until a rate misses (at most 4 times the model's rate), then bisects")
	fs.IntVar(&cfg.Steps, "search-steps", 2, "bisection steps of each rate search after its bracket")
	fs.Float64Var(&cfg.Goal, "goal", bench.DefaultGoal, "fraction of requests that must meet both SLOs for a rate to count")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for prompts, lengths and arrivals")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 4096, "every simulated engine's --max-model-len (beyond the tokenizer model's, so long prompts fit)")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "limit for each request (wall clock)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := common.finish(); err != nil {
		return err
	}
	cfg.ProxyArgs = strings.Fields(*proxyExtra)
	var err error
	if cfg.Engines, err = parseInts(*engines); err != nil {
		return fmt.Errorf("--engines: %w", err)
	}
	if cfg.Workloads, err = experimentWorkloads(*workloads, map[string]string{"chat": *chatRates, "long": *longRates}, slos, "--fit-%s-rates"); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return experiment.RunRatio(ctx, cfg)
}
