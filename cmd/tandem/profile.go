package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// runProfile implements "tandem profile": it measures the real forward pass
// of a model on this machine over a grid of step shapes and writes the
// profile that `tandem serve --simulate PROFILE.json` replays.
func runProfile(args []string) error {
	fs := flag.NewFlagSet("tandem profile", flag.ContinueOnError)
	dir := fs.String("model", "", "model directory (Hugging Face layout; default: the embedded stories260K story model)")
	out := fs.String("out", "profile.json", "file to write the profile to")
	threads := fs.Int("threads", runtime.GOMAXPROCS(0), "compute threads, as the engine will run with")
	blockSize := fs.Int("block-size", 16, "tokens per KV-cache block, as the engine will run with")
	kvDType := fs.String("kv-cache-dtype", "auto", "KV-cache element type, as the engine will run with")
	budget := fs.Duration("budget", 90*time.Second, "time limit for the measurements (the largest points are skipped when it runs out)")
	prefill := fs.String("prefill-tokens", intList(sim.DefaultPrefillTokens), "prompt sizes to measure, comma-separated")
	batches := fs.String("batches", intList(sim.DefaultBatches), "decode batch sizes to measure, comma-separated")
	contexts := fs.String("contexts", intList(sim.DefaultContexts), "decode context lengths to measure, comma-separated")
	maxKV := byteSize(1 << 30)
	fs.Var(&maxKV, "max-kv-memory", "skip decode points whose KV cache would exceed this")
	quiet := fs.Bool("quiet", false, "do not print each point")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *threads < 1 || *blockSize < 1 || *budget <= 0 {
		return errors.New("--threads, --block-size and --budget must be positive")
	}
	var grid [3][]int
	for i, s := range []*string{prefill, batches, contexts} {
		v, err := parseIntList(*s)
		if err != nil {
			return err
		}
		grid[i] = v
	}
	dt, set, err := kvlayout.ParseElemType(*kvDType)
	if err != nil {
		return err
	}
	if *dir == "" {
		if *dir, err = useDefaultModel(os.Stderr); err != nil {
			return err
		}
	}
	// The kernels serve would choose, so that the profile times them.
	if _, err := calibrateKernels(slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		return err
	}
	pool := tensor.NewPool(*threads)
	defer pool.Close()
	m, err := model.Load(*dir, pool)
	if err != nil {
		return err
	}
	defer m.Close()
	if !set {
		dt = m.KVDType()
	}
	name := filepath.Base(filepath.Clean(*dir))
	fmt.Fprintf(os.Stderr, "profiling %s (%s, %d threads) for at most %v\n", name, m.DType(), *threads, *budget)
	start := time.Now()
	p, err := sim.Measure(m, sim.MeasureConfig{
		Name: name, Machine: machine(), Threads: *threads, BlockSize: *blockSize, KVDType: dt,
		PrefillTokens: grid[0], Batches: grid[1], Contexts: grid[2], MaxKVBytes: int64(maxKV), Budget: *budget,
		Progress: func(what string, d time.Duration) {
			if !*quiet {
				fmt.Fprintf(os.Stderr, "  %-32s %10.3f ms\n", what, float64(d.Microseconds())/1000)
			}
		},
	})
	if err != nil {
		return err
	}
	b, err := p.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d prefill and %d decode points in %v); serve it with: tandem serve --simulate %s\n",
		*out, len(p.Prefill), len(p.Decode), time.Since(start).Round(time.Second), *out)
	return nil
}

// machine describes this CPU for the profile.
func machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	cpu := runtime.GOARCH
	if err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s, kernels %s", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, tensor.ISA())
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseIntList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}
