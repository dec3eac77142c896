package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/plot"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/launch"
)

// runBenchExperiment is `tandem bench experiment pd`: it starts the
// configurations to compare on this machine, runs the same workloads
// against each in alternating rounds, stops them and writes a report with
// plots.
func runBenchExperiment(args []string) error {
	if len(args) == 0 || args[0] != "pd" {
		return errors.New("usage: tandem bench experiment pd --model DIR [flags] (the only experiment is pd)")
	}
	fs := flag.NewFlagSet("bench experiment pd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench experiment pd --model DIR [flags]\n\n"+
			"Compares, on this machine and model, a colocated engine on all cores (its\n"+
			"--max-num-batched-tokens chosen by a small sweep on the long workload) with 1 prefill\n"+
			"+ 1 decode engine (half the cores each) behind tandem proxy. Each workload runs open\n"+
			"loop (Poisson) at each rate against both, in alternating rounds. Writes report.txt,\n"+
			"results-*.json and plots into --out.\n\n")
		fs.PrintDefaults()
	}
	var (
		modelDir   = fs.String("model", "", "model directory (required), e.g. from `tandem model init --shape smollm2-135m --dtype bf16 --out DIR`")
		outDir     = fs.String("out", "bench-pd", "directory for the report, JSON and plots")
		workloads  = fs.String("workloads", "chat,long", "workloads to run: chat and/or long")
		chatRates  = fs.String("chat-rates", "1,2,4", "arrival rates (req/s) of the chat workload")
		longRates  = fs.String("long-rates", "0.2,0.4,0.6", "arrival rates (req/s) of the long workload")
		requests   = fs.Int("requests", 24, "requests per rate and round")
		rounds     = fs.Int("rounds", 2, "rounds per rate; the configurations alternate order")
		mnbtSweep  = fs.String("mnbt-sweep", "128,256,512,2048", "colocated --max-num-batched-tokens values to tune over (one value: no tuning)")
		tuneReqs   = fs.Int("tune-requests", 12, "requests per tuning run (long workload at its middle rate)")
		configs    = fs.String("configs", "colocated,pd", "configurations: colocated, pd; conditional (the router's conditional disaggregation) is a hook without a router yet")
		chatTTFT   = fs.Duration("slo-chat-ttft", time.Second, "chat workload TTFT SLO")
		chatTPOT   = fs.Duration("slo-chat-tpot", 100*time.Millisecond, "chat workload TPOT SLO")
		longTTFT   = fs.Duration("slo-long-ttft", 5*time.Second, "long workload TTFT SLO")
		longTPOT   = fs.Duration("slo-long-tpot", 100*time.Millisecond, "long workload TPOT SLO")
		seed       = fs.Uint64("seed", 0, "seed for prompts, lengths and arrivals")
		maxContext = fs.Int("max-context", 0, "clip requests to this many tokens (default: the model's)")
		timeout    = fs.Duration("timeout", 10*time.Minute, "limit for each request")
		extra      = fs.String("engine-args", "", "extra `tandem serve` flags for every engine, space-separated")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *modelDir == "" {
		return errors.New("--model DIR is required (make one with: tandem model init --shape smollm2-135m --dtype bf16 --out /tmp/smol)")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	mnbts, err := parseInts(*mnbtSweep)
	if err != nil {
		return fmt.Errorf("--mnbt-sweep: %w", err)
	}
	x := &experiment{exe: exe, model: *modelDir, out: *outDir, extra: strings.Fields(*extra),
		requests: *requests, rounds: *rounds, seed: *seed, maxContext: *maxContext, timeout: *timeout,
		log: os.Stderr}
	specs := map[string]experimentWorkload{
		"chat": {name: "chat", rates: *chatRates, slo: bench.SLO{TTFT: *chatTTFT, TPOT: *chatTPOT}},
		"long": {name: "long", rates: *longRates, slo: bench.SLO{TTFT: *longTTFT, TPOT: *longTPOT}},
	}
	for _, w := range strings.Split(*workloads, ",") {
		s, ok := specs[strings.TrimSpace(w)]
		if !ok {
			return fmt.Errorf("--workloads: unknown workload %q (want chat, long)", w)
		}
		if s.parsed, err = parseFloats(s.rates); err != nil {
			return fmt.Errorf("--%s-rates: %w", s.name, err)
		}
		x.workloads = append(x.workloads, s)
	}
	for _, c := range strings.Split(*configs, ",") {
		c = strings.TrimSpace(c)
		if _, ok := configurations[c]; !ok {
			return fmt.Errorf("--configs: unknown configuration %q (want colocated, pd, conditional)", c)
		}
		x.configs = append(x.configs, c)
	}
	if err := os.MkdirAll(filepath.Join(x.out, "logs"), 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer x.stopAll()
	return x.run(ctx, mnbts, *tuneReqs)
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

type experimentWorkload struct {
	name   string
	rates  string
	parsed []float64
	slo    bench.SLO
}

// experiment is one run of `tandem bench experiment pd`.
type experiment struct {
	exe, model, out string
	extra           []string
	workloads       []experimentWorkload
	configs         []string
	requests        int
	rounds          int
	seed            uint64
	maxContext      int
	timeout         time.Duration
	log             io.Writer
	procs           []*exec.Cmd
	cpus            []int
	secret          string
}

// configuration starts one of the compared setups and returns its URL and,
// for the P/D setup, the proxy's and decode engine's URLs for the time
// breakdown. mnbt is the colocated engine's chunk budget.
type configuration func(x *experiment, ctx context.Context, mnbt int) (url string, metricsURLs []string, err error)

// configurations are the setups `--configs` may name.
var configurations = map[string]configuration{
	"colocated": (*experiment).startColocated,
	"pd":        (*experiment).startPD,
	// conditional is the hook for the router's conditional disaggregation
	// (each request to P/D or to a colocated engine by its prompt length and
	// the load). The router does not exist yet; when it lands, start it
	// here like startPD and the rest of the experiment needs no change.
	"conditional": func(*experiment, context.Context, int) (string, []string, error) {
		return "", nil, errors.New("configuration conditional: the router's conditional disaggregation is not built yet; this is its hook (cmd/tandem/bench_experiment.go, configurations)")
	},
}

func (x *experiment) logf(format string, args ...any) {
	fmt.Fprintf(x.log, "experiment: "+format+"\n", args...)
}

func (x *experiment) run(ctx context.Context, mnbts []int, tuneReqs int) error {
	cpus, err := launch.AllowedCPUs()
	if err != nil {
		return err
	}
	x.cpus = cpus
	x.secret = cmp.Or(os.Getenv(kvxfer.SecretEnv), kvxfer.GenerateSecret())
	var report strings.Builder
	w := io.MultiWriter(&report, os.Stdout)
	fmt.Fprintf(w, "tandem bench experiment pd: model %s, %d CPUs %v, %s, started %s\n", x.model, len(cpus), cpus, runtime.Version(), time.Now().Format(time.DateTime))
	fmt.Fprintf(w, "configurations: %s; %d requests per rate and round, %d rounds, configurations alternating\n\n", strings.Join(x.configs, ", "), x.requests, x.rounds)

	mnbt := mnbts[len(mnbts)-1]
	if len(mnbts) > 1 && contains(x.configs, "colocated") {
		if mnbt, err = x.tune(ctx, w, mnbts, tuneReqs); err != nil {
			return err
		}
	}
	var targets []bench.Target
	metricsURLs := map[string][]string{}
	for _, c := range x.configs {
		url, murls, err := configurations[c](x, ctx, mnbt)
		if err != nil {
			return err
		}
		targets = append(targets, bench.Target{Name: c, URL: url})
		metricsURLs[c] = murls
	}
	var suites []*bench.Suite
	for _, wl := range x.workloads {
		fmt.Fprintf(w, "== workload %s, SLO TTFT ≤ %v and TPOT ≤ %v ==\n", wl.name, wl.slo.TTFT, wl.slo.TPOT)
		before := scrapeAll(ctx, metricsURLs["pd"])
		s, err := x.runWorkload(ctx, targets, wl, loadsOf(wl.parsed), x.rounds, x.requests)
		if err != nil {
			return err
		}
		if err := bench.WriteTable(w, s); err != nil {
			return err
		}
		if len(metricsURLs["pd"]) > 0 {
			writeBreakdown(w, before, scrapeAll(ctx, metricsURLs["pd"]))
		}
		if err := writeJSONFile(filepath.Join(x.out, "results-"+wl.name+".json"), s); err != nil {
			return err
		}
		files, err := plot.Suite(x.out, wl.name+"-", s)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "plots: %s\n\n", strings.Join(files, ", "))
		suites = append(suites, s)
	}
	writeRatioModel(w, suites)
	fmt.Fprintf(w, "\nconditional disaggregation (the router's): not measured; the router does not exist yet (configuration hook \"conditional\").\n")
	x.stopAll()
	return os.WriteFile(filepath.Join(x.out, "report.txt"), []byte(report.String()), 0o644)
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func loadsOf(rates []float64) []bench.Load {
	var ls []bench.Load
	for _, r := range rates {
		ls = append(ls, bench.Load{Rate: r, Burstiness: 1})
	}
	return ls
}

// runWorkload builds the workload with the first target's tokenizer and runs
// it against every target.
func (x *experiment) runWorkload(ctx context.Context, targets []bench.Target, wl experimentWorkload, loads []bench.Load, rounds, requests int) (*bench.Suite, error) {
	p := &bench.Plan{Targets: targets, Loads: loads, Rounds: rounds, Seed: x.seed, Timeout: x.timeout, SLO: wl.slo,
		Progress: x.log, ProgressEvery: 10 * time.Second}
	wf := &workloadFlags{kind: wl.name, requests: requests, seed: x.seed, maxContext: x.maxContext, given: map[string]bool{}}
	if err := prepare(ctx, p, wf); err != nil {
		return nil, err
	}
	return bench.Run(ctx, p)
}

// tune runs the long workload at its middle rate against a colocated engine
// with each chunk budget and keeps the one with the best goodput (then the
// lowest ITL p99): a 2048-token chunk is a second-long step on a small CPU,
// and comparing P/D against that would be a straw man.
func (x *experiment) tune(ctx context.Context, w io.Writer, mnbts []int, reqs int) (int, error) {
	wl := x.workloads[len(x.workloads)-1]
	for _, c := range x.workloads {
		if c.name == "long" {
			wl = c
		}
	}
	rate := wl.parsed[len(wl.parsed)/2]
	fmt.Fprintf(w, "== tuning the colocated engine's --max-num-batched-tokens on the %s workload at %g req/s, %d requests ==\n", wl.name, rate, reqs)
	best, bestGood, bestITL := 0, -1.0, math.Inf(1)
	for _, m := range mnbts {
		url, _, err := x.startColocated(ctx, m)
		if err != nil {
			return 0, err
		}
		s, err := x.runWorkload(ctx, []bench.Target{{Name: fmt.Sprintf("colocated-mnbt%d", m), URL: url}}, wl, loadsOf([]float64{rate}), 1, reqs)
		x.stopAll()
		if err != nil {
			return 0, err
		}
		r := s.Results[0]
		fmt.Fprintf(w, "  --max-num-batched-tokens %5d: SLO met %3.0f%%, goodput %.2f req/s, TTFT p90 %.0f ms, TPOT p99 %.1f ms, ITL p99 %.0f ms\n",
			m, 100*r.Attained, r.Goodput, r.TTFT.P90, r.TPOT.P99, r.ITL.P99)
		if r.Goodput > bestGood || (r.Goodput == bestGood && r.ITL.P99 < bestITL) {
			best, bestGood, bestITL = m, r.Goodput, r.ITL.P99
		}
	}
	fmt.Fprintf(w, "  chosen: %d\n\n", best)
	return best, nil
}

// startColocated starts one engine on every allowed CPU.
func (x *experiment) startColocated(ctx context.Context, mnbt int) (string, []string, error) {
	ports, err := launch.FreePorts("127.0.0.1", 2)
	if err != nil {
		return "", nil, err
	}
	s := launch.EngineSpec{Name: fmt.Sprintf("colocated-mnbt%d", mnbt), Host: "127.0.0.1", Port: ports[0], KVPort: ports[1], CPUs: x.cpus}
	args := launch.ServeArgs(s, x.model, filepath.Base(x.model), append([]string{"--max-num-batched-tokens", strconv.Itoa(mnbt)}, x.extra...))
	// A colocated engine has no role: drop "--role ''".
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--role" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	if err := x.start(s, args); err != nil {
		return "", nil, err
	}
	return s.URL(), nil, waitHealth(ctx, s.URL(), 10*time.Minute)
}

// startPD starts a prefill and a decode engine on half the CPUs each and a
// tandem proxy in front of them.
func (x *experiment) startPD(ctx context.Context, _ int) (string, []string, error) {
	cores, err := launch.SplitCores(x.cpus, 2, 0)
	if err != nil {
		return "", nil, err
	}
	ports, err := launch.FreePorts("127.0.0.1", 5)
	if err != nil {
		return "", nil, err
	}
	specs, err := launch.PlanEngines("127.0.0.1", 1, 1, cores, ports[:4])
	if err != nil {
		return "", nil, err
	}
	for _, s := range specs {
		if err := x.start(s, launch.ServeArgs(s, x.model, filepath.Base(x.model), x.extra)); err != nil {
			return "", nil, err
		}
	}
	for _, s := range specs {
		if err := waitHealth(ctx, s.URL(), 10*time.Minute); err != nil {
			return "", nil, err
		}
	}
	proxy := launch.EngineSpec{Name: "proxy", Host: "127.0.0.1", Port: ports[4], CPUs: x.cpus}
	if err := x.start(proxy, []string{"proxy", "--host", "127.0.0.1", "--port", strconv.Itoa(ports[4]),
		"--prefill", specs[0].URL(), "--decode", specs[1].URL()}); err != nil {
		return "", nil, err
	}
	if err := waitHealth(ctx, proxy.URL(), time.Minute); err != nil {
		return "", nil, err
	}
	return proxy.URL(), []string{proxy.URL(), specs[0].URL(), specs[1].URL()}, nil
}

// start starts one child process pinned to s.CPUs, its output in
// OUT/logs/NAME.log.
func (x *experiment) start(s launch.EngineSpec, args []string) error {
	logf, err := os.Create(filepath.Join(x.out, "logs", s.Name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(x.exe, args...)
	cmd.Env = append(launch.Env(s, os.Environ()), kvxfer.SecretEnv+"="+x.secret)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd, s.CPUs); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", s.Name, err)
	}
	logf.Close() // the child has its own descriptor
	x.logf("started %s (pid %d) on %s, CPUs %v", s.Name, cmd.Process.Pid, s.URL(), s.CPUs)
	x.procs = append(x.procs, cmd)
	return nil
}

// stopAll stops every child this experiment started: SIGTERM, then SIGKILL
// after 10 s.
func (x *experiment) stopAll() {
	for _, c := range x.procs {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range x.procs {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	x.procs = nil
}

// startPinned starts cmd with its CPU affinity set to cpus from birth: the
// fork happens on a goroutine locked to its thread whose mask is narrowed
// for the fork and restored after (as internal/launch does).
func startPinned(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	var want, old unix.CPUSet
	for _, c := range cpus {
		want.Set(c)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := unix.SchedSetaffinity(0, &want); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		err := cmd.Start()
		if unix.SchedSetaffinity(0, &old) != nil {
			errc <- err // stay locked: the thread exits with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

func waitHealth(ctx context.Context, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %v (see the logs directory)", url, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scrapeAll reads the _sum and _count of every histogram on the /metrics
// pages of urls, keyed by metric name.
func scrapeAll(ctx context.Context, urls []string) map[string]float64 {
	out := map[string]float64{}
	for _, u := range urls {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			name, val, ok := strings.Cut(line, " ")
			if !ok || strings.HasPrefix(line, "#") {
				continue
			}
			base, _, _ := strings.Cut(name, "{")
			if strings.HasSuffix(base, "_sum") || strings.HasSuffix(base, "_count") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					out[base] += f
				}
			}
		}
		resp.Body.Close()
	}
	return out
}

// writeBreakdown prints the mean time per request of each P/D phase the
// proxy and engines measure, from their histograms' growth over a workload.
// These are means over all rates and rounds, not per-request spans: the
// engines and proxy do not return per-request timings.
func writeBreakdown(w io.Writer, before, after map[string]float64) {
	mean := func(name string) (float64, bool) {
		n := after[name+"_count"] - before[name+"_count"]
		if n <= 0 {
			return 0, false
		}
		return 1000 * (after[name+"_sum"] - before[name+"_sum"]) / n, true
	}
	fmt.Fprintf(w, "P/D time breakdown (means over the pd configuration's requests, from the proxy's and engines' /metrics histograms):\n")
	for _, m := range []struct{ name, what string }{
		{"tandem:proxy_prefill_seconds", "proxy: prefill leg (queue + prefill on the prefill engine)"},
		{"tandem:proxy_decode_ttfb_seconds", "proxy: decode leg to its first byte (KV pull + first decode step + queue)"},
		{"tandem:kv_transfer_seconds", "decode engine: KV transfer of one request"},
		{"vllm:request_queue_time_seconds", "both engines: time waiting to be scheduled"},
		{"vllm:time_to_first_token_seconds", "both engines: their own TTFT (prefill's = its leg)"},
		{"tandem:proxy_request_seconds", "proxy: whole request"},
	} {
		if v, ok := mean(m.name); ok {
			fmt.Fprintf(w, "  %-70s %8.1f ms\n", m.what, v)
		} else {
			fmt.Fprintf(w, "  %-70s %8s\n", m.what, "n/a")
		}
	}
}

// writeRatioModel prints a DistServe-style placement model, simplified:
// from the pd configuration's run with the lowest TTFT p50, the prefill
// engine's service time per request s (that TTFT p50, an upper bound) and, from its runs that met the TPOT
// SLO at p90, the decode engine's output rate; a prefill engine is an
// M/D/1 queue whose utilisation must keep the mean TTFT within the SLO, a
// decode engine sustains the output rate measured. For N engines the P:D
// split maximises min(P·prefill rate, D·decode rate).
func writeRatioModel(w io.Writer, suites []*bench.Suite) {
	fmt.Fprintf(w, "\nP:D ratio model (DistServe-style, simplified; from the pd configuration's measurements):\n")
	for _, s := range suites {
		var low, bestDecode *bench.Result
		for _, r := range s.Results {
			if r.Target != "pd" {
				continue
			}
			// The quietest run (lowest TTFT p50) is the best estimate of the
			// service time on this noisy machine.
			if r.Completed > 0 && (low == nil || r.TTFT.P50 < low.TTFT.P50) {
				low = r
			}
			if r.Failed == 0 && (s.Plan.SLO.TPOT == 0 || r.TPOT.P90 <= float64(s.Plan.SLO.TPOT)/1e6) && (bestDecode == nil || r.OutputThroughput > bestDecode.OutputThroughput) {
				bestDecode = r
			}
		}
		if low == nil || bestDecode == nil || low.Completed == 0 {
			fmt.Fprintf(w, "  %s: no pd run to model from\n", s.Plan.Workload.Name)
			continue
		}
		meanIn := float64(low.TotalInputTokens) / float64(low.Completed)
		meanOut := float64(bestDecode.TotalOutputTokens) / float64(max(bestDecode.Completed, 1))
		svc := low.TTFT.P50 / 1000 // s per request on the prefill engine, incl. transfer
		slo := s.Plan.SLO.TTFT.Seconds()
		rho := 0.0
		if x := slo / svc; x > 1 {
			rho = (2*x - 2) / (2*x - 1) // M/D/1: s·(1 + ρ/(2(1-ρ))) ≤ SLO
		}
		prefillRate := rho / svc
		decodeRate := bestDecode.OutputThroughput / meanOut // a lower bound: the best rate measured
		fmt.Fprintf(w, "  %s: mean prompt %.0f, output %.0f tokens; prefill engine %.0f prompt tok/s (s = %.2f s), at most %.0f%% busy for TTFT ≤ %v → %.2f req/s; decode engine ≥ %.2f req/s (%.0f output tok/s at TPOT p90 ≤ SLO)\n",
			s.Plan.Workload.Name, meanIn, meanOut, meanIn/svc, svc, 100*rho, s.Plan.SLO.TTFT, prefillRate, decodeRate, bestDecode.OutputThroughput)
		if prefillRate <= 0 {
			fmt.Fprintf(w, "    a prefill alone takes longer than the TTFT SLO: no P:D ratio meets it\n")
			continue
		}
		fmt.Fprintf(w, "    best split of N engines (predicted goodput):")
		for _, n := range []int{2, 4, 8, 16, 32} {
			bestP, bestG := 1, 0.0
			for p := 1; p < n; p++ {
				if g := math.Min(float64(p)*prefillRate, float64(n-p)*decodeRate); g > bestG {
					bestP, bestG = p, g
				}
			}
			fmt.Fprintf(w, " N=%d %dP:%dD %.2f req/s;", n, bestP, n-bestP, bestG)
		}
		fmt.Fprintln(w)
	}
}
