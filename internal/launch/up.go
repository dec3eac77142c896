package launch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Config configures Run. Zero values take the defaults on each field.
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
	// Prefill and Decode are the numbers of engines. Default 1 each.
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
	// disaggregation decider (proxy.Config); empty takes its defaults.
	Policy, PDDecider string
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
	// APIKey, if set, is required by the proxy from clients and by the
	// engines from the proxy (Authorization: Bearer).
	APIKey string
	// Stdout receives the endpoint and examples; Stderr the prefixed logs.
	// Default os.Stdout and os.Stderr.
	Stdout, Stderr io.Writer
}

func (c *Config) setDefaults() error {
	if c.Executable == "" {
		return errors.New("up: no tandem executable to start the engines with")
	}
	if c.Prefill == 0 {
		c.Prefill = 1
	}
	if c.Decode == 0 {
		c.Decode = 1
	}
	if c.Prefill < 0 || c.Decode < 0 {
		return fmt.Errorf("--prefill %d --decode %d: want at least one of each", c.Prefill, c.Decode)
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

// Run starts the engines and the proxy, prints the endpoint, and serves
// until ctx is done (nil error) or a child dies (an error naming it, how it
// ended and its last log lines). Either way every child is stopped before
// Run returns.
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
	exited := make(chan *child, n)
	var children []*child
	defer func() { stopAll(children, cfg.StopTimeout) }()
	extra := cfg.ExtraArgs
	if cfg.KVBidirectional {
		extra = append([]string{"--kv-bidirectional"}, extra...)
	}
	for _, s := range specs {
		c, err := startEngine(cfg.Executable, s, model, name, extra, env, out, exited)
		if err != nil {
			return err
		}
		children = append(children, c)
		fmt.Fprintf(cfg.Stderr, "started %s (pid %d) on %s, CPUs %v\n", s.Name, c.cmd.Process.Pid, s.URL(), s.CPUs)
	}

	if err := waitHealthy(ctx, specs, exited, cfg.StartupTimeout); err != nil {
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
	p, err := proxy.New(proxy.Config{
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
	})
	if err != nil {
		return err
	}
	p.CheckHealth(ctx)
	pctx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	proxyErr := make(chan error, 1)
	go func() { proxyErr <- p.Serve(pctx, ln) }()

	printEndpoint(cfg.Stdout, "http://"+ln.Addr().String(), name, cfg.Prefill, cfg.Decode, HasChatTemplate(model), cfg.APIKey != "")

	var result error
	select {
	case <-ctx.Done():
		fmt.Fprintln(cfg.Stderr, "stopping: proxy, then engines")
	case c := <-exited:
		result = errors.New(c.report(" while serving"))
	case err := <-proxyErr:
		result = fmt.Errorf("the proxy stopped: %w", err)
		proxyErr <- nil // for the wait below
	}
	stopProxy()
	<-proxyErr
	stopAll(children, cfg.StopTimeout)
	return result
}

// startEngine starts one engine process with its cores, environment and log
// relay, and reaps it in the background, sending it to exited when it ends.
func startEngine(exe string, s EngineSpec, model, name string, extra, env []string, out *output, exited chan<- *child) (*child, error) {
	logs := newLineRelay(s.Name, out)
	cmd := exec.Command(exe, ServeArgs(s, model, name, extra)...)
	cmd.Env = append(Env(s, os.Environ()), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's Ctrl-C reaches only tandem
		// up, which then stops the engines in order.
		Setpgid: true,
		// If tandem up is killed outright, the kernel kills the engines.
		Pdeathsig: syscall.SIGKILL,
	}
	cmd.WaitDelay = 5 * time.Second // don't hang on pipes held by a grandchild
	if err := startPinned(cmd, s.CPUs); err != nil {
		return nil, fmt.Errorf("starting %s (%s %s): %w", s.Name, exe, strings.Join(cmd.Args[1:], " "), err)
	}
	c := &child{name: s.Name, cmd: cmd, logs: logs, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logs.Flush()
		close(c.done)
		exited <- c
	}()
	return c, nil
}

// waitHealthy polls every engine's /health until all answer 200, failing
// when one exits, ctx is done or timeout passes.
func waitHealthy(ctx context.Context, specs []EngineSpec, exited <-chan *child, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	ready := make([]bool, len(specs))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for i, s := range specs {
			if !ready[i] {
				ready[i] = healthy(ctx, client, s.URL())
				all = all && ready[i]
			}
		}
		if all {
			return nil
		}
		select {
		case c := <-exited:
			return errors.New(c.report(" during startup"))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				var waiting []string
				for i, s := range specs {
					if !ready[i] {
						waiting = append(waiting, s.Name)
					}
				}
				return fmt.Errorf("%s not healthy after %v (raise the limit with --startup-timeout)", strings.Join(waiting, ", "), timeout)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func healthy(ctx context.Context, client *http.Client, base string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// EndpointPrefix starts the line that announces the endpoint; scripts and
// tests wait for it.
const EndpointPrefix = "tandem up: serving "

func printEndpoint(w io.Writer, url, name string, prefill, decode int, chat, apiKey bool) {
	auth := ""
	if apiKey {
		auth = " -H \"Authorization: Bearer $" + openai.APIKeyEnv + "\""
	}
	fmt.Fprintf(w, "%s%s (%d prefill + %d decode, model %q)\n", EndpointPrefix, url, prefill, decode, name)
	fmt.Fprintf(w, "Try:\n  curl -si %s/v1/completions -H 'Content-Type: application/json'%s \\\n"+
		"    -d '{\"model\":%q,\"prompt\":\"Once upon a time\",\"max_tokens\":32}'\n", url, auth, name)
	if chat {
		fmt.Fprintf(w, "  curl -si %s/v1/chat/completions -H 'Content-Type: application/json'%s \\\n"+
			"    -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],\"max_tokens\":32}'\n", url, auth, name)
	}
	fmt.Fprintf(w, "The x-tandem-pd response header says whether a request took the prefill/decode path.\n"+
		"Health: %s/health  Metrics: %s/metrics  Stop: Ctrl-C\n", url, url)
}
