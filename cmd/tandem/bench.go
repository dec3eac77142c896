package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// workloadFlags are the flags that choose a workload, shared with
// `tandem bench experiment`.
type workloadFlags struct {
	kind          string
	requests      int
	promptTokens  int
	maxTokens     int
	input, output string
	prefixGroups  int
	prefixTokens  int
	turns, think  string
	traceBlock    int
	traceSpeed    float64
	seed          uint64
	vocab         int
	tokenizer     string
	maxContext    int
	// given names the flags set on the command line.
	given map[string]bool
}

func (f *workloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kind, "workload", "fixed", "fixed (--prompt-tokens/--max-tokens or --input/--output distributions), chat (ShareGPT-shaped mix), long (1–2k-token prompts, 100–300 outputs), prefix (shared system prompts), multiturn (conversations), or trace:FILE (Mooncake/Azure-style JSONL)")
	fs.IntVar(&f.requests, "requests", 64, "requests (conversations for multiturn) per load level and round")
	fs.IntVar(&f.promptTokens, "prompt-tokens", 128, "prompt length of the fixed workload")
	fs.IntVar(&f.maxTokens, "max-tokens", 64, "output length of the fixed workload")
	fs.StringVar(&f.input, "input", "", "prompt length distribution: N, uniform:MIN:MAX, normal:MEAN:STD[:MIN:MAX], lognormal:MEDIAN:SIGMA[:MIN:MAX] (per turn for multiturn, the suffix for prefix)")
	fs.StringVar(&f.output, "output", "", "output length distribution (same forms as --input)")
	fs.IntVar(&f.prefixGroups, "prefix-groups", 4, "prefix workload: number of distinct shared prefixes")
	fs.IntVar(&f.prefixTokens, "prefix-tokens", 512, "prefix workload: length of each shared prefix")
	fs.StringVar(&f.turns, "turns", "uniform:2:6", "multiturn: turns per conversation (distribution)")
	fs.StringVar(&f.think, "think", "lognormal:1000:0.5:100:5000", "multiturn: think time between turns in milliseconds (distribution)")
	fs.IntVar(&f.traceBlock, "trace-block", 512, "trace: tokens per hash id")
	fs.Float64Var(&f.traceSpeed, "trace-speed", 1, "trace: replay speed (2 = twice as fast)")
	fs.Uint64Var(&f.seed, "seed", 0, "seed for prompts, lengths and arrivals")
	fs.IntVar(&f.vocab, "vocab", 0, "draw prompt ids from [10, min(vocab,1000)) instead of tokenizing a sample text")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "model directory whose tokenizer makes the prompt ids when no target serves /tokenize (default: --model when it is a directory)")
	fs.IntVar(&f.maxContext, "max-context", 0, "clip requests to this many tokens (default: the server's max_model_len when /v1/models reports one)")
}

func distOr(s string, def workload.Dist) (workload.Dist, error) {
	if s == "" {
		return def, nil
	}
	return workload.ParseDist(s)
}

// build makes the workload from the flags and the prompt token pool.
func (f *workloadFlags) build(pool []int32) (*workload.Workload, error) {
	if f.requests < 1 {
		return nil, fmt.Errorf("--requests must be at least 1, got %d", f.requests)
	}
	var w *workload.Workload
	kind, file, _ := strings.Cut(f.kind, ":")
	defIn, defOut := workload.Fixed(max(f.promptTokens, 1)), workload.Fixed(max(f.maxTokens, 1))
	switch kind {
	case "chat":
		defIn, defOut = workload.ChatInput, workload.ChatOutput
	case "long":
		defIn, defOut = workload.LongInput, workload.LongOutput
	}
	in, err := distOr(f.input, defIn)
	if err != nil {
		return nil, fmt.Errorf("--input: %w", err)
	}
	out, err := distOr(f.output, defOut)
	if err != nil {
		return nil, fmt.Errorf("--output: %w", err)
	}
	switch kind {
	case "fixed", "chat", "long":
		w = workload.Lengths(kind, f.seed, f.requests, in, out, pool)
	case "prefix":
		if w, err = workload.SharedPrefix(f.seed, f.requests, f.prefixGroups, f.prefixTokens, in, out, pool); err != nil {
			return nil, err
		}
	case "multiturn":
		turns, err := workload.ParseDist(f.turns)
		if err != nil {
			return nil, fmt.Errorf("--turns: %w", err)
		}
		think, err := workload.ParseDist(f.think)
		if err != nil {
			return nil, fmt.Errorf("--think: %w", err)
		}
		w = workload.MultiTurn(f.seed, f.requests, turns, in, out, think, pool)
	case "trace":
		if file == "" {
			return nil, errors.New("--workload trace:FILE needs a file")
		}
		fh, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		limit := f.requests
		if !f.given["requests"] {
			limit = 0
		}
		if w, err = workload.ReadTrace(fh, file, workload.TraceOptions{BlockTokens: f.traceBlock, Speed: f.traceSpeed, Limit: limit}, f.seed, pool); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("--workload %q: want fixed, chat, long, prefix, multiturn or trace:FILE", f.kind)
	}
	w.Fit(f.maxContext)
	return w, nil
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
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench [--url URL | --target NAME=URL ...] [flags]\n"+
			"       tandem bench experiment pd [flags]   (see tandem bench experiment pd -h)\n"+
			"       tandem bench experiment ratio [flags] (see tandem bench experiment ratio -h)\n"+
			"       tandem bench soak [flags]            (see tandem bench soak -h)\n"+
			"       tandem bench report [flags] FILE.json (a saved run, re-read under other SLOs)\n\n"+
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
		wf         workloadFlags
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
		progress   = fs.Duration("progress", 5*time.Second, "period of progress lines on stderr (0: none)")
		allowFail  = fs.Bool("allow-failures", false, "exit 0 even when requests failed (they are still reported, and count as SLO misses); without it a failed request makes the command fail after writing its results")
	)
	wf.register(fs)
	fs.Var(&targets, "target", "NAME=URL of a server to compare (repeat for several)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	wf.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { wf.given[f.Name] = true })

	p := &bench.Plan{Model: *model, Rounds: *rounds, Seed: wf.seed, Timeout: *timeout,
		SLO: bench.SLO{TTFT: *sloTTFT, TPOT: *sloTPOT, ITL: *sloITL}, APIKey: cmp.Or(*apiKey, os.Getenv(openai.APIKeyEnv))}
	if *progress > 0 {
		p.Progress, p.ProgressEvery = os.Stderr, *progress
	}
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
	loads, err := parseLoads(*conc, *sweep, *rate, *rates, *burst, strings.HasPrefix(wf.kind, "trace:"))
	if err != nil {
		return err
	}
	p.Loads = loads

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := prepare(ctx, p, &wf, os.Stderr); err != nil {
		return err
	}
	var s *bench.Suite
	if *search {
		var res []bench.SearchResult
		res, err = bench.SearchRate(ctx, p, bench.SearchConfig{Target: *searchGoal, Low: *searchLo, High: *searchHi, Steps: *searchN}, os.Stderr)
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
		if err := writeJSONFile(jsonFile, s); err != nil {
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

// prepare resolves the model name, the context limit and the prompt token
// pool, and builds the workload. Nothing here needs more than
// /v1/completions of the targets:
//   - the model name is --model, or the first of /v1/models (of the first
//     target that answers); a --model that is a directory with a tokenizer
//     (a model directory) names the model as /v1/models lists it (its path
//     or base name) or, without /v1/models, by its base name, tandem serve's
//     default --served-model-name;
//   - prompt ids are [10, --vocab) with --vocab, else the distinct ids of a
//     sample text as the first target with /tokenize tokenizes it, else as
//     the tokenizer of --tokenizer DIR (or of a --model DIR) does, else
//     bench.DefaultPool, with a warning (a proxy, vLLM's toy proxy among
//     them, need not serve /tokenize);
//   - a multi-turn answer goes back into the next turn as the tokens of its
//     target's /tokenize, else of the local tokenizer, else as as many
//     stand-in tokens.
func prepare(ctx context.Context, p *bench.Plan, wf *workloadFlags, log io.Writer) error {
	client := func(t bench.Target, conns int) *bench.Client {
		c := bench.NewClient(t.URL, conns)
		c.APIKey = p.APIKey
		return c
	}
	tokDir := wf.tokenizer
	modelDir := ""
	if p.Model != "" && isTokenizerDir(p.Model) {
		modelDir = p.Model
		tokDir = cmp.Or(tokDir, modelDir)
	}
	var listed []bench.ModelInfo
	var listErr error
	for _, t := range p.Targets {
		models, err := client(t, 1).Models(ctx)
		if err == nil && len(models) > 0 {
			listed = models
			break
		}
		listErr = cmp.Or(err, fmt.Errorf("%s/v1/models lists no models", t.URL))
	}
	switch {
	case modelDir != "":
		base := filepath.Base(filepath.Clean(modelDir))
		p.Model = base
		for _, m := range listed {
			if m.ID == modelDir || m.ID == filepath.Clean(modelDir) || m.ID == base {
				p.Model = m.ID
				break
			}
		}
	case p.Model == "" && len(listed) == 0:
		return fmt.Errorf("listing models (give --model to skip this): %w", listErr)
	case p.Model == "":
		p.Model = listed[0].ID
	}
	for _, m := range listed {
		if m.ID == p.Model && wf.maxContext == 0 {
			wf.maxContext = m.MaxModelLen
		}
	}

	var local *tokenizer.Tokenizer
	if tokDir != "" {
		tok, err := tokenizer.Load(tokDir)
		if err != nil {
			return fmt.Errorf("loading the tokenizer of %s: %w", tokDir, err)
		}
		local = tok
	}
	serverTok := map[string]*bench.Client{}
	var pool []int32
	if wf.vocab > 0 {
		pool = bench.VocabPool(wf.vocab)
	} else {
		for _, t := range p.Targets {
			c := client(t, 4)
			ids, err := c.Tokenize(ctx, p.Model, bench.SampleText)
			if err != nil || len(ids) == 0 {
				continue
			}
			serverTok[t.Name] = c
			if pool == nil {
				pool, _ = bench.TextPool(ids)
				fmt.Fprintf(log, "prompt token ids: the %d distinct ids of a sample text as %s's /tokenize tokenizes it\n", len(pool), t.Name)
			}
		}
		if pool == nil && local != nil {
			var err error
			if pool, err = bench.TextPool(local.Encode(bench.SampleText, false)); err != nil {
				return fmt.Errorf("the tokenizer of %s: %w", tokDir, err)
			}
			fmt.Fprintf(log, "prompt token ids: the %d distinct ids of a sample text as the tokenizer of %s tokenizes it (no target serves /tokenize)\n", len(pool), tokDir)
		}
		if pool == nil {
			pool = bench.DefaultPool()
			fmt.Fprintf(log, "warning: no target serves /tokenize and no tokenizer was given: prompt ids are %d..%d, valid for a vocabulary of at least %d tokens but not known to be ordinary text; pass --tokenizer DIR (the model's directory) or --vocab N\n",
				bench.DefaultPoolLow, bench.DefaultPoolHigh-1, bench.DefaultPoolHigh)
		}
	}
	p.Pool = pool
	if len(serverTok) > 0 || local != nil {
		p.Tokenize = func(ctx context.Context, t bench.Target, text string) ([]int32, error) {
			if c, ok := serverTok[t.Name]; ok {
				return c.Tokenize(ctx, p.Model, text)
			}
			if local != nil {
				return local.Encode(text, false), nil
			}
			return nil, errors.New("no tokenizer for this target")
		}
	}
	w, err := wf.build(pool)
	if err != nil {
		return err
	}
	p.Workload = w
	return nil
}

// isTokenizerDir says whether dir is a directory holding a tokenizer.json.
func isTokenizerDir(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, "tokenizer.json"))
	return err == nil && st.Mode().IsRegular()
}

func writeJSONFile(path string, v any) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(f, v); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
