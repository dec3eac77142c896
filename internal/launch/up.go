package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Config configures Run. Zero values take the defaults on each field, but
// for Prefill and Decode, which are taken as given.
type Config struct {
	// Executable is the tandem binary that runs the engines. Required; the
	// command passes os.Executable().
	Executable string
	// ModelDir is the model to serve. Empty means the embedded default
	// model (internal/defaultmodel), written once to DefaultModelDir.
	ModelDir string
	// DefaultModelDir is where the default model is written. Default
	// defaultmodel.CacheDir().
	DefaultModelDir string
	// ServedModelName is the model's name in the API. Default: the base name
	// of the model directory, or defaultmodel.Name for the default model.
	ServedModelName string
	// Prefill and Decode are the numbers of engines, taken as given (the
	// command's flags hold the defaults). Decode is at least 1. Prefill 0
	// is the colocated split: every engine a decode that prefills its own
	// prompts, which needs a decider that keeps prompts local when no
	// prefill engine is listed (conditional or priced, not always). With
	// the planner they are the split at start, and it may move engines
	// into a prefill pool from there.
	Prefill, Decode int
	// Host is the address of the proxy and the engines. Default 127.0.0.1.
	Host string
	// Port is the proxy's port. Default 8000; 0 picks a free one.
	Port int
	// ThreadsPerEngine is the cores given to each engine; 0 splits the
	// allowed cores evenly (see SplitCores).
	ThreadsPerEngine int
	// CPUs are the cores to split. Default AllowedCPUs().
	CPUs []int
	// ExtraArgs are appended to every engine's `tandem serve` command line.
	ExtraArgs []string
	// KVBidirectional starts every engine with --kv-bidirectional (before
	// ExtraArgs) and the proxy in conversation mode: multi-turn KV reuse.
	KVBidirectional bool
	// Policy and PDDecider are the proxy's routing policy and
	// disaggregation decider (proxy.Config); empty takes
	// proxy.DefaultPolicy and proxy.DefaultPDDecider.
	Policy, PDDecider string
	// PDTTFTObjective and PDTPOTObjective are the priced decider's
	// objectives (factory.Options); zero takes its defaults.
	PDTTFTObjective, PDTPOTObjective time.Duration
	// FirstByteTimeout and StallTimeout are the proxy's leg deadlines
	// (proxy.Config); zero takes its defaults.
	FirstByteTimeout, StallTimeout time.Duration
	// StartupTimeout bounds the wait for every engine to be healthy.
	// Default 10m (a large model loads slowly on a CPU).
	StartupTimeout time.Duration
	// StopTimeout is how long engines get to exit after SIGTERM before
	// SIGKILL. Default 10s.
	StopTimeout time.Duration
	// Simulate, if set, starts simulated engines (`tandem serve
	// --simulate`, internal/sim): "builtin" for the built-in time model,
	// else a profile file from `tandem profile`. Engine flags such as
	// --sim-speed go in ExtraArgs.
	Simulate string
	// Restart says when an engine that exits while serving is started
	// again (RestartPolicy; zero fields take its defaults).
	Restart RestartPolicy
	// APIKey, if set, is required by the proxy from clients and by the
	// engines from the proxy (Authorization: Bearer).
	APIKey string
	// Planner, when set, runs the proxy's pool planner (proxy.Config's
	// Planner) and lets it act: every engine serves both roles (tandem
	// serve --role both) and the proxy moves engines between the prefill
	// and decode pools as the planner decides (an engine joins its new
	// pool at once while its old role's work finishes, and is not moved
	// again before that work has ended); Prefill and Decode are the split
	// at start. PlanInterval is the period of its
	// decisions (zero: the proxy's default).
	Planner      *planner.Config
	PlanInterval time.Duration
	// Stdout receives the endpoint and examples; Stderr the prefixed logs.
	// Default os.Stdout and os.Stderr.
	Stdout, Stderr io.Writer
}

func (c *Config) setDefaults() error {
	if c.Executable == "" {
		return errors.New("up: no tandem executable to start the engines with")
	}
	if c.PDDecider == "" {
		c.PDDecider = proxy.DefaultPDDecider
	}
	if err := c.checkSplit(); err != nil {
		return err
	}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("--port %d is not a port", c.Port)
	}
	if c.StartupTimeout <= 0 {
		c.StartupTimeout = 10 * time.Minute
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.Policy == "" {
		c.Policy = proxy.DefaultPolicy
	}
	c.Restart.setDefaults()
	switch c.Simulate {
	case "":
	case "builtin":
		c.ExtraArgs = append([]string{"--simulate"}, c.ExtraArgs...)
	default:
		abs, err := filepath.Abs(c.Simulate)
		if err != nil {
			return err
		}
		c.ExtraArgs = append([]string{"--simulate=" + abs}, c.ExtraArgs...)
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.CPUs == nil {
		cpus, err := AllowedCPUs()
		if err != nil {
			return err
		}
		c.CPUs = cpus
	}
	return nil
}

// checkSplit refuses engine counts tandem up cannot serve with, naming
// the flags: no decode engine, a negative count, no prefill engine under a
// decider that sends every prompt to one, or the planner with a single
// engine to split.
func (c *Config) checkSplit() error {
	switch {
	case c.Decode < 1 || c.Prefill < 0:
		return fmt.Errorf("--prefill %d --decode %d: tandem up needs at least one decode engine and no negative count "+
			"(--prefill 0 makes every engine a decode that prefills its own prompts); for one engine alone, use tandem serve", c.Prefill, c.Decode)
	case c.Prefill == 0 && !proxy.KeepsLocalWithoutPrefill(c.PDDecider):
		return fmt.Errorf("--prefill 0 with --pd-decider %s: that decider sends every prompt to a prefill engine; "+
			"use --pd-decider conditional or priced, which prefill on the decode when no prefill engine is listed, or start one with --prefill 1", c.PDDecider)
	case c.Planner != nil && c.Prefill+c.Decode < 2:
		return fmt.Errorf("--prefill %d --decode %d: the planner splits at least two engines between prefill and decode; "+
			"start more (e.g. --decode 2), or leave out --slo-ttft and --slo-tpot", c.Prefill, c.Decode)
	}
	return nil
}

// Run starts the engines and the proxy, prints the endpoint, and serves
// until ctx is done (nil error). An engine that exits while serving is
// started again on its ports and cores, after a backoff, as cfg.Restart
// allows (see supervisor); meanwhile the proxy routes around it. Run
// returns an error naming the engine, how it ended and its last log lines
// when the engine exits once more than the policy allows, when an engine
// fails during startup, or when the proxy stops. Either way every child is
// stopped before Run returns.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	out := &output{w: cfg.Stderr}

	model, name := cfg.ModelDir, cfg.ServedModelName
	if model == "" {
		dir, err := defaultmodel.Install(cfg.DefaultModelDir)
		if err != nil {
			return err
		}
		model = dir
		if name == "" {
			name = defaultmodel.Name
		}
		if cfg.Simulate == "" {
			fmt.Fprintf(cfg.Stdout, "%s\n\n", defaultmodel.Describe(dir))
		}
	} else if err := checkModelDir(model); err != nil {
		return err
	}
	if cfg.Simulate != "" {
		fmt.Fprintf(cfg.Stdout, "Simulated engines: real engines whose forward pass sleeps for a time model's step time; answers are\n"+
			"deterministic but not language (tokens from %s's vocabulary). See internal/sim and docs/performance.md.\n\n", filepath.Base(model))
	}
	if abs, err := filepath.Abs(model); err == nil {
		model = abs
	}
	if name == "" {
		name = filepath.Base(model)
	}

	n := cfg.Prefill + cfg.Decode
	cores, err := SplitCores(cfg.CPUs, n, cfg.ThreadsPerEngine)
	if err != nil {
		return err
	}
	// The proxy's own port is bound first and kept, so a busy --port fails
	// before any engine starts.
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another server using it? choose another --port)", addr, err)
	}
	defer ln.Close()
	ports, err := FreePorts(cfg.Host, 2*n)
	if err != nil {
		return err
	}
	specs, err := PlanEngines(cfg.Host, cfg.Prefill, cfg.Decode, cores, ports)
	if err != nil {
		return err
	}

	// The engines share a fresh KV secret (unless the environment names
	// one): the prefill signs the params it returns, the decode accepts only
	// those, and the side channel authenticates both ends. It reaches them
	// through the environment, which other users cannot read, not the
	// command line.
	env := []string{kvxfer.SecretEnv + "=" + cmp.Or(os.Getenv(kvxfer.SecretEnv), kvxfer.GenerateSecret())}
	if cfg.APIKey != "" {
		env = append(env, openai.APIKeyEnv+"="+cfg.APIKey)
	}
	var children []*Process
	defer func() { Stop(children, cfg.StopTimeout) }()
	// A decode that cannot pull a prompt's KV (its prefill was restarted
	// and lost what it held) computes the prompt itself rather than failing
	// the request; --kv-load-failure-policy after -- overrides it.
	extra := append([]string{"--kv-load-failure-policy", "recompute"}, cfg.ExtraArgs...)
	if cfg.KVBidirectional {
		extra = append([]string{"--kv-bidirectional"}, extra...)
	}
	engines := make([]*engine, 0, n)
	for _, s := range specs {
		as := s
		if cfg.Planner != nil {
			as.Role = RoleBoth // the proxy's pools decide what it does
		}
		spec := ProcessSpec{Name: s.Name, Path: cfg.Executable, Args: ServeArgs(as, model, name, extra), Env: env,
			CPUs: s.CPUs, URL: s.URL(), Output: out}
		c, err := Start(spec)
		if err != nil {
			return err
		}
		children = append(children, c)
		engines = append(engines, &engine{spec: spec, role: s.Role, proc: c})
		fmt.Fprintf(cfg.Stderr, "started %s (pid %d) on %s, CPUs %v\n", s.Name, c.PID(), s.URL(), s.CPUs)
	}

	if err := WaitHealthy(ctx, children, cfg.StartupTimeout); err != nil {
		if errors.Is(err, ErrNotHealthy) {
			return fmt.Errorf("%w (raise the limit with --startup-timeout)", err)
		}
		return err
	}
	var prefillURLs, decodeURLs []string
	for _, s := range specs {
		if s.Role == RolePrefill {
			prefillURLs = append(prefillURLs, s.URL())
		} else {
			decodeURLs = append(decodeURLs, s.URL())
		}
	}
	plog := slog.New(slog.NewTextHandler(newLineRelay("proxy", out), nil))
	// The router counts tokens with the engines' own tokenizer.
	tok, terr := tokenizer.Load(model)
	if terr != nil {
		plog.Warn("router counts tokens approximately: the model's tokenizer did not load", "err", terr)
		tok = nil
	}
	pcfg := proxy.Config{
		Prefill:       prefillURLs,
		Decode:        decodeURLs,
		Fallback:      true,
		APIKey:        cfg.APIKey,
		Conversations: cfg.KVBidirectional,
		Policy:        cfg.Policy,
		PDDecider:     cfg.PDDecider,
		Tokenizer:     tok,
		Logger:        plog,

		FirstByteTimeout: cfg.FirstByteTimeout,
		StallTimeout:     cfg.StallTimeout,

		Planner:      cfg.Planner,
		PlannerAct:   cfg.Planner != nil,
		PlanInterval: cfg.PlanInterval,
	}
	pcfg.Router.TTFTObjective, pcfg.Router.TPOTObjective = cfg.PDTTFTObjective, cfg.PDTPOTObjective
	p, err := proxy.New(pcfg)
	if err != nil {
		return err
	}
	ulog := slog.New(slog.NewTextHandler(newLineRelay("up", out), nil))
	sup, err := newSupervisor(cfg.Restart, cfg.StartupTimeout, cfg.StopTimeout, ulog, p.BackendsChanged, p.MetricsRegisterer())
	if err != nil {
		return err
	}
	p.CheckHealth(ctx)
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	proxyErr := make(chan error, 1)
	go func() { proxyErr <- p.Serve(pctx, ln) }()

	// One supervisor goroutine per engine; the first to give up stops
	// everything. They are stopped (no more restarts) before the engines.
	sctx, stopSupervisors := context.WithCancel(ctx)
	defer stopSupervisors()
	gaveUp := make(chan error, n)
	var watching sync.WaitGroup
	for _, e := range engines {
		watching.Go(func() {
			if err := sup.watch(sctx, e); err != nil {
				gaveUp <- err
			}
		})
	}

	printEndpoint(cfg.Stdout, "http://"+ln.Addr().String(), name, cfg.Prefill, cfg.Decode, HasChatTemplate(model), cfg.APIKey != "")
	if cfg.Planner != nil {
		fmt.Fprintf(cfg.Stdout, "The planner moves engines between prefill and decode as the traffic asks (TTFT %v, TPOT %v): tandem plan --url http://%s\n",
			cfg.Planner.TTFT, cfg.Planner.TPOT, ln.Addr())
	}

	var result error
	select {
	case <-ctx.Done():
		fmt.Fprintln(cfg.Stderr, "stopping: proxy, then engines")
	case result = <-gaveUp:
	case err := <-proxyErr:
		result = fmt.Errorf("the proxy stopped: %w; stopping the engines", err)
		proxyErr <- nil // for the wait below
	}
	stopSupervisors()
	watching.Wait()
	children = children[:0]
	for _, e := range engines {
		children = append(children, e.current())
	}
	stopProxy()
	<-proxyErr
	Stop(children, cfg.StopTimeout)
	return result
}

// EndpointPrefix starts the line that announces the endpoint; scripts and
// tests wait for it.
const EndpointPrefix = "tandem up: serving "

func printEndpoint(w io.Writer, url, name string, prefill, decode int, chat, apiKey bool) {
	auth := ""
	if apiKey {
		auth = " -H \"Authorization: Bearer $" + openai.APIKeyEnv + "\""
	}
	split := fmt.Sprintf("%d prefill + %d decode", prefill, decode)
	if prefill == 0 {
		split = fmt.Sprintf("%d decode, colocated: each prefills its own prompts", decode)
	}
	fmt.Fprintf(w, "%s%s (%s, model %q)\n", EndpointPrefix, url, split, name)
	fmt.Fprintf(w, "Try:\n  curl -si %s/v1/completions -H 'Content-Type: application/json'%s \\\n"+
		"    -d '{\"model\":%q,\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n", url, auth, name)
	if chat {
		fmt.Fprintf(w, "  curl -si %s/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"+
			"    -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],\"max_tokens\":32}'\n", url, auth, name)
	}
	fmt.Fprintf(w, "The x-tandem-pd response header says whether a request took the prefill/decode path.\n"+
		"Health: %s/health  Metrics: %s/metrics  Stop: Ctrl-C\n", url, url)
}
