package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// runBenchSoak is `tandem bench soak`: 2 prefill + 2 decode engines and a
// proxy as processes, bounded load for --duration with kill -9/restart and
// SIGSTOP/SIGCONT faults on a schedule, then the invariants (no hung
// request, no KV held after the drain, flat RSS); it fails when one breaks
// (experiment.RunSoak).
func runBenchSoak(args []string) error {
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench soak [--model DIR] [--duration D] [flags]\n\n"+
			"Starts 2 prefill + 2 decode engines and a tandem proxy as processes, runs bounded load\n"+
			"(Poisson at --rate, or a closed loop of --concurrency) for --duration while injecting\n"+
			"faults every --fault-every (kill -9 and restart on the same ports, SIGSTOP for --stall\n"+
			"then SIGCONT), alternating prefill and decode engines. Reports requests by outcome and\n"+
			"error kind, hung requests, KV still held after the drain and every engine's RSS over\n"+
			"time; exits non-zero if a request hung, KV stayed held or RSS grew beyond the tolerance.\n\n")
		fs.PrintDefaults()
	}
	var cfg experiment.Soak
	common := addExperimentFlags(fs, &cfg.Common, "bench-soak", "directory for report.txt and the processes' logs", "model directory (default: the embedded stories260K, installed as `tandem up` does)")
	fs.DurationVar(&cfg.Duration, "duration", time.Minute, "how long the load runs")
	fs.Float64Var(&cfg.Rate, "rate", 4, "Poisson arrival rate in requests/s (0: a closed loop of --concurrency)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "requests in flight at most (with --rate 0: exactly)")
	fs.IntVar(&cfg.PromptTokens, "prompt-tokens", 64, "prompt length")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 32, "output length (ignore_eos)")
	fs.DurationVar(&cfg.Deadline, "deadline", time.Minute, "hard per-request deadline: a request still running then counts as hung")
	fs.DurationVar(&cfg.FaultEvery, "fault-every", 10*time.Second, "period of the faults (0: none)")
	fs.DurationVar(&cfg.Stall, "stall", 3*time.Second, "how long a SIGSTOPped engine stays stopped")
	fs.DurationVar(&cfg.KVLease, "kv-lease", 3*time.Second, "the engines' --kv-lease: short, so KV a killed decode never read is freed quickly")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 0, "how long KV may take to reach 0 after the load (default 3 × --kv-lease + 10s)")
	fs.DurationVar(&cfg.ProxyTimeout, "proxy-timeout", 10*time.Second, "the proxy's --timeout (prefill leg, decode headers, gaps between chunks)")
	fs.DurationVar(&cfg.RSSEvery, "rss-every", time.Second, "period of the RSS samples")
	fs.Float64Var(&cfg.RSSLimit.Fraction, "rss-tolerance", 0.25, "allowed RSS growth of a process life, as a fraction of its first half's peak")
	slackMiB := fs.Float64("rss-slack-mib", 16, "allowed RSS growth in MiB however small the process")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for prompts and arrivals")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := common.finish(); err != nil {
		return err
	}
	cfg.RSSLimit.Slack = int64(*slackMiB * (1 << 20))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return experiment.RunSoak(ctx, cfg)
}
