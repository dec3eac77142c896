package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/progress"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// registerWorkloadFlags defines the flags that choose a workload on fs,
// filling src as they are parsed.
func registerWorkloadFlags(fs *flag.FlagSet, src *bench.WorkloadSource) {
	w := &src.Spec
	fs.StringVar(&w.Kind, "workload", "fixed", "fixed (--prompt-tokens/--max-tokens or --input/--output distributions), chat (ShareGPT-shaped mix), long (1–2k-token prompts, 100–300 outputs), prefix (shared system prompts), multiturn (conversations), or trace:FILE (Mooncake/Azure-style JSONL)")
	fs.IntVar(&w.Requests, "requests", 64, "requests (conversations for multiturn) per load level and round")
	fs.IntVar(&w.PromptTokens, "prompt-tokens", 128, "prompt length of the fixed workload")
	fs.IntVar(&w.MaxTokens, "max-tokens", 64, "output length of the fixed workload")
	fs.StringVar(&w.Input, "input", "", "prompt length distribution: N, uniform:MIN:MAX, normal:MEAN:STD[:MIN:MAX], lognormal:MEDIAN:SIGMA[:MIN:MAX] (per turn for multiturn, the suffix for prefix)")
	fs.StringVar(&w.Output, "output", "", "output length distribution (same forms as --input)")
	fs.IntVar(&w.PrefixGroups, "prefix-groups", 4, "prefix workload: number of distinct shared prefixes")
	fs.IntVar(&w.PrefixTokens, "prefix-tokens", 512, "prefix workload: length of each shared prefix")
	fs.StringVar(&w.Turns, "turns", "uniform:2:6", "multiturn: turns per conversation (distribution)")
	fs.StringVar(&w.Think, "think", "lognormal:1000:0.5:100:5000", "multiturn: think time between turns in milliseconds (distribution)")
	fs.IntVar(&w.TraceBlock, "trace-block", 512, "trace: tokens per hash id")
	fs.Float64Var(&w.TraceSpeed, "trace-speed", 1, "trace: replay speed (2 = twice as fast)")
	fs.Uint64Var(&w.Seed, "seed", 0, "seed for prompts, lengths and arrivals")
	fs.IntVar(&src.Vocab, "vocab", 0, "draw prompt ids from [10, min(vocab,1000)) instead of tokenizing a sample text")
	fs.StringVar(&src.Tokenizer, "tokenizer", "", "model directory whose tokenizer makes the prompt ids when no target serves /tokenize (default: --model when it is a directory)")
	fs.IntVar(&w.MaxContext, "max-context", 0, "clip requests to this many tokens (default: the server's max_model_len when /v1/models reports one)")
}

// runBench is `tandem bench`: a serving benchmark against one or more
// OpenAI-compatible servers (tandem engines, proxies, vLLM).
func runBench(args []string) error {
	if len(args) > 0 && args[0] == "experiment" {
		return runBenchExperiment(args[1:])
	}
	if len(args) > 0 && args[0] == "soak" {
		return runBenchSoak(args[1:])
	}
	if len(args) > 0 && args[0] == "report" {
		return runBenchReport(args[1:])
	}
	if len(args) > 0 && args[0] == "model" {
		return runBenchModel(args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench [--url URL | --target NAME=URL ...] [flags]\n"+
			"       tandem bench experiment pd [flags]   (see tandem bench experiment pd -h)\n"+
			"       tandem bench experiment ratio [flags] (see tandem bench experiment ratio -h)\n"+
			"       tandem bench soak [flags]            (see tandem bench soak -h)\n"+
			"       tandem bench report [flags] FILE.json (a saved run, re-read under other SLOs)\n"+
			"       tandem bench model [flags]           (this CPU's kernels per weight format, see -h)\n\n"+
			"Streams /v1/completions requests whose prompts are token ids and whose outputs are exact\n"+
			"lengths (ignore_eos) and reports TTFT, TPOT, ITL and E2E percentiles, throughput, SLO\n"+
			"attainment and goodput, and the P/D path (x-tandem-pd) per target and load level.\n"+
			"With several targets the same requests go to each, in alternating rounds. Every load\n"+
			"level and round has prompts of its own (the token ids relabelled), so a prefix cache\n"+
			"warmed by one level does not serve the next; a server that keeps its cache between\n"+
			"runs serves a repeated run's prompts from it: change --seed between such runs.\n\n")
		fs.PrintDefaults()
	}
	var (
		src        bench.WorkloadSource
		targets    repeated
		url        = fs.String("url", "http://127.0.0.1:8000", "server root URL (when no --target is given)")
		model      = fs.String("model", "", "model name, or the model's directory (its tokenizer then makes the prompt ids); when given, /v1/models is not needed (default: the first of /v1/models)")
		apiKey     = fs.String("api-key", "", "send Authorization: Bearer KEY (default: $"+openai.APIKeyEnv+")")
		conc       = fs.Int("concurrency", 0, "closed loop of this many requests in flight; with --rate, a cap (0: none)")
		sweep      = fs.String("sweep", "", "comma-separated concurrencies for closed loops, e.g. 1,4,16")
		rate       = fs.Float64("rate", 0, "arrival rate in requests/s (Poisson, or gamma with --burstiness)")
		rates      = fs.String("rates", "", "comma-separated arrival rates to sweep, e.g. 0.5,1,2")
		burst      = fs.Float64("burstiness", 1, "gamma shape of the arrival gaps: 1 is Poisson, below 1 burstier")
		rounds     = fs.Int("rounds", 1, "rounds per load level; targets alternate order each round")
		timeout    = fs.Duration("timeout", 10*time.Minute, "limit for each request")
		sloTTFT    = fs.Duration("slo-ttft", 0, "SLO on time to first token, e.g. 2s")
		sloTPOT    = fs.Duration("slo-tpot", 0, "SLO on time per output token, e.g. 100ms")
		sloITL     = fs.Duration("slo-itl", 0, "SLO on every inter-token gap (catches stalls a mean TPOT hides)")
		search     = fs.Bool("search", false, "search for the highest rate at which --search-target of requests meet the SLO")
		searchGoal = fs.Float64("search-target", 0.9, "fraction of requests that must meet the SLO")
		searchLo   = fs.Float64("search-low", 0.25, "lowest rate the search tries")
		searchHi   = fs.Float64("search-high", 64, "highest rate the search tries")
		searchN    = fs.Int("search-steps", 3, "bisection steps after the bracket is found")
		jsonF      = fs.String("json", "", "write every result and per-request record as JSON to this file")
		plots      = fs.String("plots", "", "write PNG and SVG plots into this directory")
		allowFail  = fs.Bool("allow-failures", false, "exit 0 even when requests failed (they are still reported, and count as SLO misses); without it a failed request makes the command fail after writing its results")
	)
	registerWorkloadFlags(fs, &src)
	fs.Var(&targets, "target", "NAME=URL of a server to compare (repeat for several)")
	var pf progress.Flags
	pf.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "requests" { // a trace is read whole unless --requests caps it
			src.Spec.TraceLimit = src.Spec.Requests
		}
	})

	p := &bench.Plan{Model: *model, Rounds: *rounds, Seed: src.Spec.Seed, Timeout: *timeout,
		SLO: bench.SLO{TTFT: *sloTTFT, TPOT: *sloTPOT, ITL: *sloITL}, APIKey: cmp.Or(*apiKey, os.Getenv(openai.APIKeyEnv))}
	p.Progress = pf.New(os.Stderr)
	if len(targets) == 0 {
		targets = repeated{"target=" + *url}
	}
	for _, s := range targets {
		t, err := bench.ParseTarget(s)
		if err != nil {
			return err
		}
		p.Targets = append(p.Targets, t)
	}
	loads, err := parseLoads(*conc, *sweep, *rate, *rates, *burst, strings.HasPrefix(src.Spec.Kind, "trace:"))
	if err != nil {
		return err
	}
	p.Loads = loads

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Prepare(ctx, p, &src, p.Progress.Writer()); err != nil {
		return err
	}
	var s *bench.Suite
	if *search {
		var res []bench.SearchResult
		res, err = bench.SearchRate(ctx, p, bench.SearchConfig{Target: *searchGoal, Low: *searchLo, High: *searchHi, Steps: *searchN}, p.Progress.Writer())
		for _, r := range res {
			fmt.Printf("%s: highest rate meeting the SLO for %.0f%% of requests: %.3g req/s (tried:", r.Target, 100**searchGoal, r.MaxRate)
			for _, pt := range r.Points {
				fmt.Printf(" %.3g→%.0f%%", pt.Rate, 100*pt.Attainment)
			}
			fmt.Println(")")
		}
		s = bench.SearchSuite(p, *searchGoal, res)
	} else {
		s, err = bench.Run(ctx, p)
	}
	if s != nil && len(s.Results) > 0 {
		if werr := writeResults(s, *jsonF, *plots); werr != nil {
			return werr
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("interrupted")
		}
		return err
	}
	if failed := failedRequests(s); failed != "" && !*allowFail {
		return fmt.Errorf("requests failed: %s (see the errors above; --allow-failures to exit 0 anyway)", failed)
	}
	return nil
}

// writeResults prints the table of s and writes its JSON and plots when
// asked to.
func writeResults(s *bench.Suite, jsonFile, plots string) error {
	if err := bench.WriteTable(os.Stdout, s); err != nil {
		return err
	}
	if jsonFile != "" {
		if err := bench.WriteJSONFile(jsonFile, s); err != nil {
			return err
		}
	}
	if plots != "" {
		files, err := plot.Suite(plots, "", s)
		if err != nil {
			return err
		}
		fmt.Printf("plots: %s\n", strings.Join(files, ", "))
	}
	return nil
}

// failedRequests lists the results of s with failed requests, "" for none.
func failedRequests(s *bench.Suite) string {
	var parts []string
	for _, r := range s.Results {
		if r.Failed > 0 {
			parts = append(parts, fmt.Sprintf("%d of %d against %s at %s", r.Failed, r.Requests, r.Target, r.Load))
		}
	}
	return strings.Join(parts, "; ")
}

// parseLoads turns the load flags into levels.
func parseLoads(conc int, sweep string, rate float64, rates string, burst float64, trace bool) ([]bench.Load, error) {
	if conc < 0 || rate < 0 || burst <= 0 {
		return nil, fmt.Errorf("--concurrency %d, --rate %v, --burstiness %v: want non-negative values and a positive burstiness", conc, rate, burst)
	}
	var loads []bench.Load
	if sweep != "" {
		cs, err := bench.ParseConcurrencies(sweep)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			loads = append(loads, bench.Load{Concurrency: c})
		}
	}
	var rs []float64
	if rates != "" {
		var err error
		if rs, err = parseFloats(rates); err != nil {
			return nil, fmt.Errorf("--rates: %w", err)
		}
	} else if rate > 0 {
		rs = []float64{rate}
	}
	for _, r := range rs {
		loads = append(loads, bench.Load{Rate: r, Burstiness: burst, Concurrency: conc})
	}
	if len(loads) == 0 {
		if trace {
			return []bench.Load{{Concurrency: conc}}, nil // the trace's own times
		}
		return []bench.Load{{Concurrency: max(conc, 1)}}, nil
	}
	return loads, nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("bad number %q in %q: want positive numbers separated by commas", f, s)
		}
		out = append(out, x)
	}
	return out, nil
}
