package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/tracing"
)

// serveFlags are the flags of `tandem serve`: the engine's server.Config,
// and what the command turns into it (the files and documents the flags
// name, the log level, the --sim-* flags). A new engine flag is a field of
// server.Config, checked in its Validate, and a line in register.
type serveFlags struct {
	server.Config

	LogLevel slog.Level
	Sim      simConfig

	chatTemplate                 string // --chat-template: a file or the template itself
	kvSecretFile, kvPeers        string
	kvTLSCert, kvTLSKey, kvTLSCA string
	kvEventsConfig               string
	otlpEndpoint                 string // --otlp-traces-endpoint
	progress                     progress.Flags
	loading                      *progress.Reporter // the model load's stage, ended by runServe
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	c := &f.Config
	fs.StringVar(&c.Model, "model", "", "model directory in Hugging Face layout (config.json, *.safetensors, tokenizer.json); required")
	fs.StringVar(&c.Host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&c.Port, "port", 8000, "port to listen on")
	fs.StringVar(&c.ServedModelName, "served-model-name", "", "model name clients send (default: the base name of --model)")

	fs.IntVar(&c.BlockSize, "block-size", 16, "tokens per KV-cache block")
	fs.StringVar(&c.KVCacheDType, "kv-cache-dtype", "auto", "KV-cache element type: auto (float32 for an f32 model, else bfloat16), bfloat16 or float32; prefill and decode engines must agree")
	fs.BoolVar(&c.DisableHybridKVCache, "disable-hybrid-kv-cache-manager", false, "keep every layer's KV for every token even for a model with sliding-window layers (by default those layers keep only their window's blocks); prefill and decode engines must agree")
	fs.IntVar(&c.NumBlocks, "num-blocks", 0, "KV-cache blocks (overrides --kv-cache-memory)")
	fs.Var((*byteSize)(&c.KVCacheMemory), "kv-cache-memory", "KV-cache size, e.g. 512MiB or 2GiB (default: room for max-num-seqs full-length sequences, capped at 20% of RAM)")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", 64, "most sequences in one batch")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", 2048, "most tokens in one step (prefill chunks beyond it)")
	fs.IntVar(&c.PrefillScheduleInterval, "prefill-schedule-interval", 1, "while requests decode, run prefill compute only on every Nth step, counted from the last step that carried prefill, unless the waiting queue did not drain (vLLM's prefill_schedule_interval: a lower ITL tail for a higher TTFT); KV loads and near-complete prompts are never held back; 1: every step")
	fs.IntVar(&c.MaxModelLen, "max-model-len", 0, "context window in tokens (default: the model's)")
	fs.IntVar(&c.Threads, "threads", runtime.GOMAXPROCS(0), "compute threads")

	c.MaxRequestBody = openai.DefaultMaxBodyBytes
	fs.Var((*byteSize)(&c.MaxRequestBody), "max-request-body", "largest request body accepted; larger ones get 413")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight may run before they are aborted. The drain: /health (readiness) answers 503 at once, /livez (liveness) stays 200, new requests get 503, and a prefill serves the KV it holds until a decode reads it or its lease ends, at most max(--shutdown-timeout, --kv-lease) after the signal (set terminationGracePeriodSeconds a few seconds above that); exit status 0 unless something was cut short. A second signal exits at once (status 1)")
	fs.TextVar(&f.LogLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	fs.StringVar(&f.chatTemplate, "chat-template", "", "Jinja chat template for /v1/chat/completions, in place of the model's: a file, or the template text itself (as vLLM's --chat-template); lets a model without a template serve chat")
	fs.BoolVar(&c.TrustRequestChatTemplate, "trust-request-chat-template", false, "render a chat request's own chat_template field (a template is code the server runs; without this flag such requests get a 400, as in vLLM)")
	fs.StringVar(&c.APIKey, "api-key", "", "require Authorization: Bearer <key> on every path but /health, /livez and /metrics (default: $"+openai.APIKeyEnv+"; the environment keeps the key out of ps)")

	fs.StringVar((*string)(&c.Role), "role", string(kvconnector.RoleBoth), "prefill (serve do_remote_decode requests and hold their KV for a decode engine), decode (pull a prefill's KV for do_remote_prefill requests) or both; every role also serves plain requests")
	fs.StringVar(&c.KVHost, "kv-host", "127.0.0.1", "KV side-channel address to listen on and to advertise to decode engines (prefill and both)")
	fs.IntVar(&c.KVPort, "kv-port", kvxfer.DefaultPort, "KV side-channel port (prefill and both); 0 picks a free one. Unless given, a taken port falls back to a free one (logged), so several engines can share a host; the port bound is what kv_transfer_params advertise")
	fs.StringVar(&c.EngineID, "engine-id", "", "this engine's id in kv_transfer_params (default: a fresh UUID per process)")
	fs.DurationVar(&c.KVLease, "kv-lease", kvxfer.DefaultLease, "how long a prefill holds KV that no decode engine has read; heartbeats from a queued decode extend it")
	fs.StringVar((*string)(&c.KVTransport), "kv-transport", string(kvxfer.TransportAuto), "how a decode pulls KV: auto (shared memory with a prefill on this host, else TCP), tcp or shm")
	fs.BoolVar(&c.KVBidirectional, "kv-bidirectional", false, "multi-turn KV reuse (vLLM's bidirectional_kv_xfer; set it on prefill and decode engines): a decode holds a finished conversation's KV and returns params naming it, and a prefill given them pulls the history instead of computing it")
	fs.DurationVar(&c.KVDecodeHoldTTL, "kv-decode-hold-ttl", kvconnector.DefaultDecodeHoldTTL, "with --kv-bidirectional, how long a decode holds a conversation's KV for its next turn (not extended by heartbeats; released earlier when the prefill pulled it or new requests need the blocks)")
	fs.IntVar(&c.KVRecomputeThreshold, "kv-recompute-threshold", kvconnector.DefaultRecomputeThreshold, "with --kv-bidirectional, a prefill computes a history shorter than this many tokens instead of pulling it")
	fs.StringVar(&f.kvSecretFile, "kv-secret-file", "", "file holding the cluster's KV secret (≥16 bytes; default $"+kvxfer.SecretEnv+"): prefill engines sign the kv_transfer_params they return, decode engines accept only signed ones, and the side channel authenticates both ends with it; every engine of a deployment needs the same one")
	fs.StringVar(&f.kvPeers, "kv-peers", "", "side-channel address allowlist, comma-separated CIDRs, IPs, host:port, loopback or any: the peers a decode dials and a prefill accepts (default without a secret: loopback; with one: any address, as the params are signed)")
	fs.StringVar(&f.kvTLSCert, "kv-tls-cert", "", "PEM certificate for mutual TLS on the KV side channel (with --kv-tls-key and --kv-tls-ca)")
	fs.StringVar(&f.kvTLSKey, "kv-tls-key", "", "PEM private key of --kv-tls-cert")
	fs.StringVar(&f.kvTLSCA, "kv-tls-ca", "", "PEM CA bundle that signs every engine's --kv-tls-cert")
	f.Sim.register(fs)
	registerOTLPFlag(fs, &f.otlpEndpoint)
	f.progress.Register(fs) // the model load's, on stderr beside the logs
	fs.StringVar(&f.kvEventsConfig, "kv-events-config", "", `publish KV cache events as vLLM does, for prefix-aware routers (llm-d, Dynamo, tandem proxy): vLLM's JSON, e.g. '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv@host@model"}' (fields publisher zmq|null, endpoint, replay_endpoint, topic, buffer_steps, hwm, max_queue_size); events carry prompt token ids, so bind to a trusted network`)
	fs.StringVar((*string)(&c.KVLoadFailurePolicy), "kv-load-failure-policy", string(sched.LoadFailureFail), "when pulling KV fails: fail (the request ends with HTTP 500) or recompute (compute the missing prompt KV locally)")
}

// parseServeFlags parses the flags of `tandem serve` into a checked
// server.Config, reading the files they name.
func parseServeFlags(args []string) (*serveFlags, error) {
	fs := flag.NewFlagSet("tandem serve", flag.ContinueOnError)
	f := &serveFlags{}
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c := &f.Config
	c.KVPortFallback = !flagGiven(fs, "kv-port")
	if c.APIKey == "" { // read after parsing, not as the flag default, so -h never prints it
		c.APIKey = os.Getenv(openai.APIKeyEnv)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := f.load(); err != nil {
		return nil, err
	}
	if err := f.Sim.validate(fs); err != nil {
		return nil, err
	}
	c.Simulate = f.Sim.simulation()
	if f.kvEventsConfig != "" {
		ev, err := kvevents.ParseConfig(f.kvEventsConfig)
		if err != nil {
			return nil, err
		}
		c.KVEvents = ev
	}
	c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: f.LogLevel}))
	c.Version = version()
	f.progress.Delay = loadDelay
	f.loading = f.progress.New(os.Stderr).Reporter("loading "+filepath.Base(filepath.Clean(c.Model)), progress.Bytes)
	c.LoadProgress = f.loading.Func()
	return f, nil
}

// flagGiven reports whether name was set on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// load reads the files the flags name into the Config.
func (f *serveFlags) load() error {
	c := &f.Config
	var err error
	if f.chatTemplate != "" {
		if c.ChatTemplate, err = openai.LoadChatTemplate(f.chatTemplate); err != nil {
			return fmt.Errorf("--chat-template: %w", err)
		}
	}
	if c.KVSecret, err = kvxfer.LoadSecret(f.kvSecretFile); err != nil {
		return err
	}
	if f.kvPeers != "" || !c.KVSecret.IsSet() {
		if c.KVPeers, err = kvxfer.ParsePeers(f.kvPeers); err != nil {
			return err
		}
	}
	if f.kvTLSCert != "" || f.kvTLSKey != "" || f.kvTLSCA != "" {
		if c.KVTLSServer, c.KVTLSClient, err = kvxfer.TLSConfigs(f.kvTLSCert, f.kvTLSKey, f.kvTLSCA); err != nil {
			return err
		}
	}
	return nil
}

// runServe is `tandem serve`: the flags, then one engine (internal/server)
// until SIGTERM or SIGINT and its drain.
func runServe(args []string) error {
	args, err := withDefaultModel(joinSimulateArg(args), os.Stderr)
	if err != nil {
		return err
	}
	f, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	stopTracing, err := startTracing(f.otlpEndpoint, "tandem-engine", tracing.AttrRole.String(string(f.Role)))
	if err != nil {
		return err
	}
	defer stopTracing()
	if f.Config.Simulate == nil {
		if _, err := calibrateKernels(f.Logger); err != nil {
			return err
		}
	}
	s, err := server.New(f.Config)
	f.loading.Done() // already done unless the load failed: its line ends before the error
	if err != nil {
		return err
	}
	reserveIOProc(f.Threads)
	ctx, stop := signalContext(f.Logger)
	defer stop()
	return s.Run(ctx)
}

// reserveIOProc raises GOMAXPROCS to one more than the compute threads.
// Through every forward pass the step loop and the pool's workers keep
// threads Ps busy, and Go does not preempt a goroutine inside an assembly
// kernel; with no P to spare, the goroutines that stream tokens to clients,
// answer HTTP and move KV blocks wait until the compute yields. Measured on
// a one-core decode engine behind the P/D proxy (docs/performance.md,
// "An engine's I/O goroutines"): a quarter of its inter-token gaps were a
// whole step late and its KV pulls took twice as long. The extra P's thread
// shares the engine's cores with the compute threads, and the kernel runs
// it as soon as it has work, which is brief.
func reserveIOProc(threads int) {
	if runtime.GOMAXPROCS(0) <= threads {
		runtime.GOMAXPROCS(threads + 1)
	}
}

// signalContext returns a context cancelled by the first SIGINT or
// SIGTERM, which starts the engine's graceful drain (internal/server); a
// second one exits the process at once (status 1). stop releases the
// signals.
func signalContext(log *slog.Logger) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			log.Warn("second signal during the drain: exiting now, requests in flight and held KV are dropped", "signal", sig.String())
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// version is the module version the binary was built from.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
