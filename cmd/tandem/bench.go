package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
)

// runBench is `tandem bench`: a serving benchmark against an
// OpenAI-compatible server (a tandem engine, proxy or vLLM).
func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench --url URL [flags]\n\n"+
			"Streams /v1/completions requests of exactly --prompt-tokens random token ids and\n"+
			"--max-tokens output tokens (ignore_eos) and reports throughput and TTFT, TPOT, ITL\n"+
			"and end-to-end latency.\n\n")
		fs.PrintDefaults()
	}
	var (
		cfg   bench.Config
		conc  = fs.Int("concurrency", 0, "requests in flight; default 1 in a closed loop, no cap with --rate")
		sweep = fs.String("sweep", "", "comma-separated concurrencies to run in turn, e.g. 1,4,16 (overrides --concurrency)")
		jsonF = fs.String("json", "", "also write the results as JSON to this file")
	)
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8000", "server root URL")
	fs.StringVar(&cfg.Model, "model", "", "model name (default: the first of /v1/models)")
	fs.IntVar(&cfg.Requests, "requests", 64, "requests per concurrency level")
	fs.IntVar(&cfg.PromptTokens, "prompt-tokens", 128, "prompt length in tokens")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 64, "output length in tokens")
	fs.Float64Var(&cfg.Rate, "rate", 0, "Poisson arrival rate in requests/s (default: closed loop)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for prompts and arrivals")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "limit for each request")
	fs.IntVar(&cfg.Vocab, "vocab", 0, "draw prompt ids from [10, min(vocab,1000)) instead of tokenizing sample text via /tokenize")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case *sweep != "":
		cs, err := bench.ParseConcurrencies(*sweep)
		if err != nil {
			return err
		}
		cfg.Concurrencies = cs
	case *conc < 0:
		return fmt.Errorf("--concurrency must be >= 0, got %d", *conc)
	case *conc == 0 && cfg.Rate == 0:
		cfg.Concurrencies = []int{1}
	default:
		cfg.Concurrencies = []int{*conc}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	reports, err := bench.RunAll(ctx, cfg)
	for _, r := range reports {
		if werr := r.WriteText(os.Stdout); werr != nil {
			return werr
		}
	}
	if len(reports) > 1 {
		if werr := bench.WriteSweep(os.Stdout, reports); werr != nil {
			return werr
		}
	}
	if *jsonF != "" && len(reports) > 0 {
		cfg.Model = reports[0].Model
		if werr := writeBenchJSON(*jsonF, &bench.Result{Config: cfg, Started: started, Results: reports}); werr != nil {
			return werr
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("interrupted after %d of %d levels", len(reports), len(cfg.Concurrencies))
		}
		return err
	}
	for _, r := range reports {
		if r.Failed > 0 {
			return fmt.Errorf("%d requests failed at concurrency %d (see above)", r.Failed, r.Concurrency)
		}
	}
	return nil
}

func writeBenchJSON(path string, res *bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(f, res); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
