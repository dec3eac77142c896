package experiment

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/soak"
	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/launch"
)

// Soak configures `tandem bench soak`: 2 prefill + 2 decode engines and a
// proxy as processes, bounded load with faults injected on a schedule
// (package soak), then the invariants.
type Soak struct {
	Common
	// ServedName is the model's name in the API (default: the base name of
	// Model). Model empty is the embedded default model (internal/defaultmodel),
	// installed as `tandem up` installs it.
	ServedName string
	// Duration is how long the load runs.
	Duration time.Duration
	// Rate is the Poisson arrival rate in requests/s; 0 runs a closed loop
	// of Concurrency. With a Rate, Concurrency caps the requests in flight.
	Rate        float64
	Concurrency int
	// PromptTokens and MaxTokens are every request's lengths.
	PromptTokens, MaxTokens int
	// Deadline is the hard per-request limit: a request still running then
	// counts as hung.
	Deadline time.Duration
	// FaultEvery is the period of the faults (0: none); Stall how long a
	// SIGSTOPped engine stays stopped.
	FaultEvery, Stall time.Duration
	// KVLease is the engines' --kv-lease; DrainTimeout how long KV may take
	// to reach 0 after the load (default 3 × KVLease + 10s).
	KVLease, DrainTimeout time.Duration
	// ProxyTimeout is the proxy's --timeout.
	ProxyTimeout time.Duration
	// RSSEvery is the period of the RSS samples; RSSLimit the growth
	// allowed.
	RSSEvery time.Duration
	RSSLimit soak.RSSLimit
	Seed     uint64
}

// RunSoak runs the soak and writes report.txt into cfg.Out; it returns an
// error naming the invariants that failed (a hung request, KV held after
// the drain, RSS growth).
func RunSoak(ctx context.Context, cfg Soak) error {
	if cfg.Duration <= 0 || cfg.Deadline <= 0 || cfg.Rate < 0 || cfg.Concurrency < 0 || (cfg.Rate == 0 && cfg.Concurrency == 0) {
		return errors.New("--duration and --deadline must be positive, and --rate or --concurrency must be set")
	}
	if cfg.Model == "" {
		dir, err := defaultmodel.Install("")
		if err != nil {
			return err
		}
		cfg.Model, cfg.ServedName = dir, cmp.Or(cfg.ServedName, defaultmodel.Name)
	}
	cfg.ServedName = cmp.Or(cfg.ServedName, filepath.Base(cfg.Model))
	cfg.EngineArgs = append([]string{"--kv-lease", cfg.KVLease.String()}, cfg.EngineArgs...)
	x, err := newProcs(&cfg.Common, "soak")
	if err != nil {
		return err
	}
	defer x.stopAll()
	c, err := x.startCluster(ctx, cfg.Model, cfg.ServedName, "", 2, 2,
		"--timeout", cfg.ProxyTimeout.String(), "--health-interval", "500ms")
	if err != nil {
		return err
	}
	sc := &soakCluster{procs: x, engines: map[string]*clusterEngine{}}
	var prefill, decode []string
	urls := map[string]string{}
	for i := range c.engines {
		e := &c.engines[i]
		sc.engines[e.spec.Name] = e
		urls[e.spec.Name] = e.spec.URL()
		if e.spec.Role == launch.RolePrefill {
			prefill = append(prefill, e.spec.Name)
		} else {
			decode = append(decode, e.spec.Name)
		}
	}

	client := bench.NewClient(c.url, max(cfg.Concurrency, 16))
	// The proxy serves no /tokenize: ask an engine.
	pool, err := bench.TokenPool(ctx, bench.NewClient(c.engines[0].spec.URL(), 1), cfg.ServedName, 0)
	if err != nil {
		return err
	}
	run := soak.Config{
		Client: client, Model: cfg.ServedName, Prompts: bench.Prompts(cfg.Seed, 0, 256, cfg.PromptTokens, pool), MaxTokens: cfg.MaxTokens,
		Rate: cfg.Rate, Concurrency: cfg.Concurrency, Seed: cfg.Seed, Duration: cfg.Duration, Deadline: cfg.Deadline,
		Faults: soak.Schedule(cfg.Duration, cfg.FaultEvery, cfg.Stall, prefill, decode), Inject: sc.inject, PIDs: sc.pids,
		SampleEvery: cfg.RSSEvery, MetricsURLs: urls, DrainTimeout: cmp.Or(cfg.DrainTimeout, 3*cfg.KVLease+10*time.Second), Log: cfg.Log,
		Progress: cfg.Progress,
	}
	var report strings.Builder
	w := io.MultiWriter(&report, cfg.Stdout)
	load := fmt.Sprintf("Poisson %g req/s, at most %d in flight", cfg.Rate, cfg.Concurrency)
	if cfg.Rate == 0 {
		load = fmt.Sprintf("closed loop of %d", cfg.Concurrency)
	}
	fmt.Fprintf(w, "tandem bench soak: model %s, 2 prefill + 2 decode engines behind a proxy, %v of %s, prompts %d and outputs %d tokens, --kv-lease %v, a fault every %v, started %s\n",
		cfg.Model, cfg.Duration, load, cfg.PromptTokens, cfg.MaxTokens, cfg.KVLease, cfg.FaultEvery, time.Now().Format(time.DateTime))
	res, err := soak.Run(ctx, run)
	if err != nil {
		return err
	}
	fails := soak.Write(w, res, cfg.RSSLimit)
	if err := os.WriteFile(filepath.Join(cfg.Out, "report.txt"), []byte(report.String()), 0o644); err != nil {
		return err
	}
	if len(fails) > 0 {
		return fmt.Errorf("soak failed %d invariant(s): %s", len(fails), strings.Join(fails, "; "))
	}
	return nil
}

// soakCluster carries out the soak's faults on the cluster's engines.
type soakCluster struct {
	*procs
	mu      sync.Mutex // guards every engine's proc and the running list
	engines map[string]*clusterEngine
	lives   map[string]int // restarts so far, for the log file names
}

// inject carries out f and returns once the engine serves again.
func (c *soakCluster) inject(ctx context.Context, f soak.Fault) error {
	c.mu.Lock()
	e, ok := c.engines[f.Engine]
	var p *launch.Process
	if ok {
		p = e.proc
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("no engine %q", f.Engine)
	}
	switch f.Kind {
	case soak.Kill:
		if err := p.Signal(syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill -9 %s: %w", e.spec.Name, err)
		}
		<-p.Done()
		c.mu.Lock()
		if c.lives == nil {
			c.lives = map[string]int{}
		}
		c.lives[e.spec.Name]++
		np, err := c.start(e.spec.Name, e.spec.CPUs, e.spec.URL(), e.args, fmt.Sprintf("%s.%d.log", e.spec.Name, c.lives[e.spec.Name]))
		if err == nil {
			e.proc = np
		}
		c.mu.Unlock()
		if err != nil {
			return err
		}
		return c.waitHealthy(ctx, []*launch.Process{np}, 2*time.Minute)
	case soak.Stall:
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP %s: %w", e.spec.Name, err)
		}
		time.Sleep(f.Stall)
		if err := p.Signal(syscall.SIGCONT); err != nil {
			return fmt.Errorf("SIGCONT %s: %w", e.spec.Name, err)
		}
		return c.waitHealthy(ctx, []*launch.Process{p}, time.Minute)
	}
	return fmt.Errorf("unknown fault %q", f.Kind)
}

// pids is every running process of the cluster by name.
func (c *soakCluster) pids() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, p := range c.running {
		if !p.Exited() {
			out[p.Name] = p.PID()
		}
	}
	return out
}
