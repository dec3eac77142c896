package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/soak"
	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/launch"
)

// runBenchSoak is `tandem bench soak`: 2 prefill + 2 decode engines and a
// proxy as processes, bounded load for --duration with kill -9/restart and
// SIGSTOP/SIGCONT faults on a schedule, then the invariants (no hung
// request, no KV held after the drain, flat RSS); it fails when one breaks.
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
	var (
		modelDir    = fs.String("model", "", "model directory (default: the embedded stories260K, installed as `tandem up` does)")
		outDir      = fs.String("out", "bench-soak", "directory for report.txt and the processes' logs")
		duration    = fs.Duration("duration", time.Minute, "how long the load runs")
		rate        = fs.Float64("rate", 4, "Poisson arrival rate in requests/s (0: a closed loop of --concurrency)")
		conc        = fs.Int("concurrency", 8, "requests in flight at most (with --rate 0: exactly)")
		promptToks  = fs.Int("prompt-tokens", 64, "prompt length")
		maxTokens   = fs.Int("max-tokens", 32, "output length (ignore_eos)")
		deadline    = fs.Duration("deadline", time.Minute, "hard per-request deadline: a request still running then counts as hung")
		faultEvery  = fs.Duration("fault-every", 10*time.Second, "period of the faults (0: none)")
		stall       = fs.Duration("stall", 3*time.Second, "how long a SIGSTOPped engine stays stopped")
		kvLease     = fs.Duration("kv-lease", 3*time.Second, "the engines' --kv-lease: short, so KV a killed decode never read is freed quickly")
		drainFor    = fs.Duration("drain-timeout", 0, "how long KV may take to reach 0 after the load (default 3 × --kv-lease + 10s)")
		proxyTO     = fs.Duration("proxy-timeout", 10*time.Second, "the proxy's --timeout (prefill leg, decode headers, gaps between chunks)")
		sampleEvery = fs.Duration("rss-every", time.Second, "period of the RSS samples")
		rssFrac     = fs.Float64("rss-tolerance", 0.25, "allowed RSS growth of a process life, as a fraction of its first half's peak")
		rssSlackMiB = fs.Float64("rss-slack-mib", 16, "allowed RSS growth in MiB however small the process")
		seed        = fs.Uint64("seed", 0, "seed for prompts and arrivals")
		extra       = fs.String("engine-args", "", "extra `tandem serve` flags for every engine, space-separated")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *duration <= 0 || *deadline <= 0 || *rate < 0 || *conc < 0 || (*rate == 0 && *conc == 0) {
		return errors.New("--duration and --deadline must be positive, and --rate or --concurrency must be set")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	name := ""
	if *modelDir == "" {
		if *modelDir, err = defaultmodel.Install(""); err != nil {
			return err
		}
		name = defaultmodel.Name
	}
	name = cmp.Or(name, filepath.Base(*modelDir))
	if err := os.MkdirAll(filepath.Join(*outDir, "logs"), 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := &soakCluster{exe: exe, model: *modelDir, name: name, out: *outDir, log: os.Stderr,
		secret: cmp.Or(os.Getenv(kvxfer.SecretEnv), kvxfer.GenerateSecret()),
		extra:  append([]string{"--kv-lease", kvLease.String()}, strings.Fields(*extra)...)}
	defer cl.stopAll()
	if err := cl.start(ctx, *proxyTO); err != nil {
		return err
	}

	client := bench.NewClient(cl.proxyURL, max(*conc, 16))
	// The proxy serves no /tokenize: ask an engine.
	pool, err := bench.TokenPool(ctx, bench.NewClient(cl.engines[0].spec.URL(), 1), name, 0)
	if err != nil {
		return err
	}
	var prefill, decode []string
	urls := map[string]string{}
	for _, e := range cl.engines {
		urls[e.spec.Name] = e.spec.URL()
		if e.spec.Role == launch.RolePrefill {
			prefill = append(prefill, e.spec.Name)
		} else {
			decode = append(decode, e.spec.Name)
		}
	}
	faults := soak.Schedule(*duration, *faultEvery, *stall, prefill, decode)
	cfg := soak.Config{
		Client: client, Model: name, Prompts: bench.Prompts(*seed, 0, 256, *promptToks, pool), MaxTokens: *maxTokens,
		Rate: *rate, Concurrency: *conc, Seed: *seed, Duration: *duration, Deadline: *deadline,
		Faults: faults, Inject: cl.inject, PIDs: cl.pids, SampleEvery: *sampleEvery,
		MetricsURLs: urls, DrainTimeout: cmp.Or(*drainFor, 3**kvLease+10*time.Second), Log: os.Stderr,
	}
	var report strings.Builder
	w := io.MultiWriter(&report, os.Stdout)
	load := fmt.Sprintf("Poisson %g req/s, at most %d in flight", *rate, *conc)
	if *rate == 0 {
		load = fmt.Sprintf("closed loop of %d", *conc)
	}
	fmt.Fprintf(w, "tandem bench soak: model %s, 2 prefill + 2 decode engines behind a proxy, %v of %s, prompts %d and outputs %d tokens, --kv-lease %v, a fault every %v, started %s\n",
		*modelDir, *duration, load, *promptToks, *maxTokens, *kvLease, *faultEvery, time.Now().Format(time.DateTime))
	res, err := soak.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fails := soak.Write(w, res, soak.RSSLimit{Fraction: *rssFrac, Slack: int64(*rssSlackMiB * (1 << 20))})
	if err := os.WriteFile(filepath.Join(*outDir, "report.txt"), []byte(report.String()), 0o644); err != nil {
		return err
	}
	if len(fails) > 0 {
		return fmt.Errorf("soak failed %d invariant(s): %s", len(fails), strings.Join(fails, "; "))
	}
	return nil
}

// soakEngine is one supervised engine process.
type soakEngine struct {
	spec launch.EngineSpec
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	life int           // restarts so far, for the log file names
}

// soakCluster is the soak's processes: 2 prefill + 2 decode engines and a
// proxy.
type soakCluster struct {
	exe, model, name, out, secret string
	extra                         []string
	log                           io.Writer
	engines                       []*soakEngine
	proxy                         *soakEngine
	proxyURL                      string
}

func (c *soakCluster) start(ctx context.Context, proxyTimeout time.Duration) error {
	cpus, err := launch.AllowedCPUs()
	if err != nil {
		return err
	}
	cores, err := launch.SplitCores(cpus, 4, 0)
	if err != nil {
		return err
	}
	ports, err := launch.FreePorts("127.0.0.1", 9)
	if err != nil {
		return err
	}
	specs, err := launch.PlanEngines("127.0.0.1", 2, 2, cores, ports[:8])
	if err != nil {
		return err
	}
	var pre, dec []string
	for _, s := range specs {
		e := &soakEngine{spec: s, args: launch.ServeArgs(s, c.model, c.name, c.extra)}
		if err := c.launch(e); err != nil {
			return err
		}
		c.engines = append(c.engines, e)
		if s.Role == launch.RolePrefill {
			pre = append(pre, s.URL())
		} else {
			dec = append(dec, s.URL())
		}
	}
	for _, e := range c.engines {
		if err := waitHealth(ctx, e.spec.URL(), 5*time.Minute); err != nil {
			return err
		}
	}
	ps := launch.EngineSpec{Name: "proxy", Host: "127.0.0.1", Port: ports[8], CPUs: cpus}
	c.proxy = &soakEngine{spec: ps, args: []string{"proxy", "--host", ps.Host, "--port", strconv.Itoa(ps.Port),
		"--prefill", strings.Join(pre, ","), "--decode", strings.Join(dec, ","),
		"--timeout", proxyTimeout.String(), "--health-interval", "500ms"}}
	if err := c.launch(c.proxy); err != nil {
		return err
	}
	c.proxyURL = ps.URL()
	return waitHealth(ctx, c.proxyURL, time.Minute)
}

// launch starts e's process, its output in OUT/logs/NAME[.N].log.
func (c *soakCluster) launch(e *soakEngine) error {
	file := e.spec.Name + ".log"
	if e.life > 0 {
		file = fmt.Sprintf("%s.%d.log", e.spec.Name, e.life)
	}
	logf, err := os.Create(filepath.Join(c.out, "logs", file))
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(c.exe, e.args...)
	cmd.Env = append(launch.Env(e.spec, os.Environ()), kvxfer.SecretEnv+"="+c.secret)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd, e.spec.CPUs); err != nil {
		return fmt.Errorf("starting %s: %w", e.spec.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.mu.Lock()
	e.cmd, e.done = cmd, done
	e.mu.Unlock()
	fmt.Fprintf(c.log, "soak: started %s (pid %d) on %s\n", e.spec.Name, cmd.Process.Pid, e.spec.URL())
	return nil
}

func (c *soakCluster) engine(name string) (*soakEngine, error) {
	for _, e := range c.engines {
		if e.spec.Name == name {
			return e, nil
		}
	}
	return nil, fmt.Errorf("no engine %q", name)
}

// inject carries out f and returns once the engine serves again.
func (c *soakCluster) inject(ctx context.Context, f soak.Fault) error {
	e, err := c.engine(f.Engine)
	if err != nil {
		return err
	}
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.mu.Unlock()
	switch f.Kind {
	case soak.Kill:
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill -9 %s: %w", e.spec.Name, err)
		}
		<-done
		e.life++
		if err := c.launch(e); err != nil {
			return err
		}
		return waitHealth(ctx, e.spec.URL(), 2*time.Minute)
	case soak.Stall:
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP %s: %w", e.spec.Name, err)
		}
		time.Sleep(f.Stall)
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return fmt.Errorf("SIGCONT %s: %w", e.spec.Name, err)
		}
		return waitHealth(ctx, e.spec.URL(), time.Minute)
	}
	return fmt.Errorf("unknown fault %q", f.Kind)
}

// pids is every running process of the cluster by name.
func (c *soakCluster) pids() map[string]int {
	out := map[string]int{}
	for _, e := range append(append([]*soakEngine(nil), c.engines...), c.proxy) {
		if e == nil {
			continue
		}
		e.mu.Lock()
		if e.cmd != nil && e.cmd.Process != nil {
			select {
			case <-e.done:
			default:
				out[e.spec.Name] = e.cmd.Process.Pid
			}
		}
		e.mu.Unlock()
	}
	return out
}

// stopAll stops every process: SIGCONT (a stopped one cannot exit), SIGTERM,
// then SIGKILL after 10 s.
func (c *soakCluster) stopAll() {
	all := append(append([]*soakEngine(nil), c.engines...), c.proxy)
	for _, e := range all {
		if e != nil && e.cmd != nil {
			_ = e.cmd.Process.Signal(syscall.SIGCONT)
			_ = e.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, e := range all {
		if e == nil || e.cmd == nil {
			continue
		}
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
	}
}
