package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// serveConfig is the configuration of `tandem serve`. Each group of flags
// registers itself in register and is checked in validate, so a new group
// (the P/D flags) is one more field, a few more lines in both, and its
// fields passed on in engineConfig.
type serveConfig struct {
	Model           string
	Host            string
	Port            int
	ServedModelName string

	BlockSize           int
	KVCacheDType        string
	NumBlocks           int
	KVCacheMemory       byteSize
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	Threads             int

	MaxRequestBody  byteSize
	ShutdownTimeout time.Duration
	LogLevel        slog.Level
	APIKey          string // --api-key, else $TANDEM_API_KEY; never logged

	ChatTemplate             string // --chat-template: a file or the template itself
	TrustRequestChatTemplate bool
	chatTemplate             string // the template text, loaded by validate

	// Disaggregated prefill/decode (see internal/kvconnector and internal/kvxfer).
	Role                 string
	KVHost               string
	KVPort               int
	EngineID             string
	KVLease              time.Duration
	KVTransport          string
	KVLoadFailurePolicy  string
	KVBidirectional      bool
	KVDecodeHoldTTL      time.Duration
	KVRecomputeThreshold int
	KVSecretFile         string
	KVPeers              string
	KVTLSCert            string
	KVTLSKey             string
	KVTLSCA              string

	// Simulated engines (internal/sim): --simulate and --sim-*.
	Sim simConfig

	// KV cache events (internal/kvevents): vLLM's --kv-events-config JSON.
	KVEventsConfig string
	kvEvents       *kvevents.Config // parsed by validate; nil: no events

	// Loaded by validate from the flags above.
	kvSecret                 kvxfer.Secret
	kvPeers                  *kvxfer.PeerPolicy
	kvTLSServer, kvTLSClient *tls.Config
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Model, "model", "", "model directory in Hugging Face layout (config.json, *.safetensors, tokenizer.json); required")
	fs.StringVar(&c.Host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&c.Port, "port", 8000, "port to listen on")
	fs.StringVar(&c.ServedModelName, "served-model-name", "", "model name clients send (default: the base name of --model)")

	fs.IntVar(&c.BlockSize, "block-size", 16, "tokens per KV-cache block")
	fs.StringVar(&c.KVCacheDType, "kv-cache-dtype", "auto", "KV-cache element type: auto (bfloat16 for a bf16 model, else float32), bfloat16 or float32; prefill and decode engines must agree")
	fs.IntVar(&c.NumBlocks, "num-blocks", 0, "KV-cache blocks (overrides --kv-cache-memory)")
	fs.Var(&c.KVCacheMemory, "kv-cache-memory", "KV-cache size, e.g. 512MiB or 2GiB (default: room for max-num-seqs full-length sequences, capped at 20% of RAM)")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", 64, "most sequences in one batch")
	fs.IntVar(&c.MaxNumBatchedTokens, "max-num-batched-tokens", 2048, "most tokens in one step (prefill chunks beyond it)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", 0, "context window in tokens (default: the model's)")
	fs.IntVar(&c.Threads, "threads", runtime.GOMAXPROCS(0), "compute threads")

	c.MaxRequestBody = openai.DefaultMaxBodyBytes
	fs.Var(&c.MaxRequestBody, "max-request-body", "largest request body accepted; larger ones get 413")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight may run before they are aborted. The drain: /health (readiness) answers 503 at once, /livez (liveness) stays 200, new requests get 503, and a prefill serves the KV it holds until a decode reads it or its lease ends, at most max(--shutdown-timeout, --kv-lease) after the signal (set terminationGracePeriodSeconds a few seconds above that); exit status 0 unless something was cut short. A second signal exits at once (status 1)")
	fs.TextVar(&c.LogLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	fs.StringVar(&c.ChatTemplate, "chat-template", "", "Jinja chat template for /v1/chat/completions, in place of the model's: a file, or the template text itself (as vLLM's --chat-template); lets a model without a template serve chat")
	fs.BoolVar(&c.TrustRequestChatTemplate, "trust-request-chat-template", false, "render a chat request's own chat_template field (a template is code the server runs; without this flag such requests get a 400, as in vLLM)")
	fs.StringVar(&c.APIKey, "api-key", "", "require Authorization: Bearer <key> on every path but /health, /livez and /metrics (default: $"+openai.APIKeyEnv+"; the environment keeps the key out of ps)")

	fs.StringVar(&c.Role, "role", string(kvconnector.RoleBoth), "prefill (serve do_remote_decode requests and hold their KV for a decode engine), decode (pull a prefill's KV for do_remote_prefill requests) or both; every role also serves plain requests")
	fs.StringVar(&c.KVHost, "kv-host", "127.0.0.1", "KV side-channel address to listen on and to advertise to decode engines (prefill and both)")
	fs.IntVar(&c.KVPort, "kv-port", kvxfer.DefaultPort, "KV side-channel port (prefill and both)")
	fs.StringVar(&c.EngineID, "engine-id", "", "this engine's id in kv_transfer_params (default: a fresh UUID per process)")
	fs.DurationVar(&c.KVLease, "kv-lease", kvxfer.DefaultLease, "how long a prefill holds KV that no decode engine has read; heartbeats from a queued decode extend it")
	fs.StringVar(&c.KVTransport, "kv-transport", string(kvxfer.TransportAuto), "how a decode pulls KV: auto (shared memory with a prefill on this host, else TCP), tcp or shm")
	fs.BoolVar(&c.KVBidirectional, "kv-bidirectional", false, "multi-turn KV reuse (vLLM's bidirectional_kv_xfer; set it on prefill and decode engines): a decode holds a finished conversation's KV and returns params naming it, and a prefill given them pulls the history instead of computing it")
	fs.DurationVar(&c.KVDecodeHoldTTL, "kv-decode-hold-ttl", kvconnector.DefaultDecodeHoldTTL, "with --kv-bidirectional, how long a decode holds a conversation's KV for its next turn (not extended by heartbeats; released earlier when the prefill pulled it or new requests need the blocks)")
	fs.IntVar(&c.KVRecomputeThreshold, "kv-recompute-threshold", kvconnector.DefaultRecomputeThreshold, "with --kv-bidirectional, a prefill computes a history shorter than this many tokens instead of pulling it")
	fs.StringVar(&c.KVSecretFile, "kv-secret-file", "", "file holding the cluster's KV secret (≥16 bytes; default $"+kvxfer.SecretEnv+"): prefill engines sign the kv_transfer_params they return, decode engines accept only signed ones, and the side channel authenticates both ends with it; every engine of a deployment needs the same one")
	fs.StringVar(&c.KVPeers, "kv-peers", "", "side-channel address allowlist, comma-separated CIDRs, IPs, host:port, loopback or any: the peers a decode dials and a prefill accepts (default without a secret: loopback; with one: any address, as the params are signed)")
	fs.StringVar(&c.KVTLSCert, "kv-tls-cert", "", "PEM certificate for mutual TLS on the KV side channel (with --kv-tls-key and --kv-tls-ca)")
	fs.StringVar(&c.KVTLSKey, "kv-tls-key", "", "PEM private key of --kv-tls-cert")
	fs.StringVar(&c.KVTLSCA, "kv-tls-ca", "", "PEM CA bundle that signs every engine's --kv-tls-cert")
	c.Sim.register(fs)
	fs.StringVar(&c.KVEventsConfig, "kv-events-config", "", `publish KV cache events as vLLM does, for prefix-aware routers (llm-d, Dynamo, tandem proxy): vLLM's JSON, e.g. '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv@host@model"}' (fields publisher zmq|null, endpoint, replay_endpoint, topic, buffer_steps, hwm, max_queue_size); events carry prompt token ids, so bind to a trusted network`)
	fs.StringVar(&c.KVLoadFailurePolicy, "kv-load-failure-policy", string(sched.LoadFailureFail), "when pulling KV fails: fail (the request ends with HTTP 500) or recompute (compute the missing prompt KV locally)")
}

func (c *serveConfig) validate() error {
	_, _, kvDTypeErr := kvlayout.ParseElemType(c.KVCacheDType)
	switch {
	case c.Model == "":
		return errors.New("--model is required: a model directory in Hugging Face layout")
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("--port %d is not a TCP port", c.Port)
	case c.BlockSize < 1:
		return fmt.Errorf("--block-size must be at least 1, got %d", c.BlockSize)
	case kvDTypeErr != nil:
		return fmt.Errorf("--kv-cache-dtype %q: want auto, bfloat16 or float32", c.KVCacheDType)
	case c.NumBlocks < 0:
		return fmt.Errorf("--num-blocks must be positive, got %d", c.NumBlocks)
	case c.NumBlocks > 0 && c.KVCacheMemory > 0:
		return errors.New("set --num-blocks or --kv-cache-memory, not both")
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("--max-num-seqs must be at least 1, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("--max-num-batched-tokens must be at least 1, got %d", c.MaxNumBatchedTokens)
	case c.MaxModelLen < 0:
		return fmt.Errorf("--max-model-len must be positive, got %d", c.MaxModelLen)
	case c.Threads < 1:
		return fmt.Errorf("--threads must be at least 1, got %d", c.Threads)
	case c.MaxRequestBody < 1:
		return errors.New("--max-request-body must be positive")
	case c.ShutdownTimeout <= 0:
		return errors.New("--shutdown-timeout must be positive")
	case c.KVPort < 0 || c.KVPort > 65535:
		return fmt.Errorf("--kv-port %d is not a TCP port", c.KVPort)
	case c.KVLease <= 0:
		return errors.New("--kv-lease must be positive")
	}
	if _, err := kvconnector.ParseRole(c.Role); err != nil {
		return fmt.Errorf("--role: %w", err)
	}
	switch kvxfer.Transport(c.KVTransport) {
	case kvxfer.TransportAuto, kvxfer.TransportTCP, kvxfer.TransportShm:
	default:
		return fmt.Errorf("--kv-transport %q: use auto, tcp or shm", c.KVTransport)
	}
	switch sched.LoadFailurePolicy(c.KVLoadFailurePolicy) {
	case sched.LoadFailureFail, sched.LoadFailureRecompute:
	default:
		return fmt.Errorf("--kv-load-failure-policy %q: use fail or recompute", c.KVLoadFailurePolicy)
	}
	var err error
	if c.ChatTemplate != "" {
		if c.chatTemplate, err = openai.LoadChatTemplate(c.ChatTemplate); err != nil {
			return fmt.Errorf("--chat-template: %w", err)
		}
	}
	if c.kvSecret, err = kvxfer.LoadSecret(c.KVSecretFile); err != nil {
		return err
	}
	if c.KVPeers != "" || !c.kvSecret.IsSet() {
		if c.kvPeers, err = kvxfer.ParsePeers(c.KVPeers); err != nil {
			return err
		}
	}
	if c.KVTLSCert != "" || c.KVTLSKey != "" || c.KVTLSCA != "" {
		if c.kvTLSServer, c.kvTLSClient, err = kvxfer.TLSConfigs(c.KVTLSCert, c.KVTLSKey, c.KVTLSCA); err != nil {
			return err
		}
	}
	if c.EngineID == "" {
		c.EngineID = uuid.NewString()
	}
	if c.ServedModelName == "" {
		c.ServedModelName = filepath.Base(filepath.Clean(c.Model))
	}
	return nil
}

// parseServeFlags parses the flags of `tandem serve`.
func parseServeFlags(args []string) (*serveConfig, error) {
	fs := flag.NewFlagSet("tandem serve", flag.ContinueOnError)
	c := &serveConfig{}
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.APIKey == "" { // read after parsing, not as the flag default, so -h never prints it
		c.APIKey = os.Getenv(openai.APIKeyEnv)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := c.Sim.validate(fs); err != nil {
		return nil, err
	}
	if c.KVEventsConfig != "" {
		ev, err := kvevents.ParseConfig(c.KVEventsConfig)
		if err != nil {
			return nil, err
		}
		c.kvEvents = ev
	}
	return c, nil
}

func runServe(args []string) error {
	args, err := withDefaultModel(joinSimulateArg(args), os.Stderr)
	if err != nil {
		return err
	}
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	reserveIOProc(cfg.Threads)
	ctx, stop := signalContext(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))
	defer stop()
	return serve(ctx, cfg, nil)
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

// serve runs an engine and its API until ctx ends, then drains (see
// drain.go): /health turns 503, requests in flight get --shutdown-timeout
// to finish (the rest are aborted), a prefill serves its held KV until it
// is read or its lease ends, then the listener closes. ready, if not nil,
// receives the listening address.
func serve(ctx context.Context, cfg *serveConfig, ready chan<- string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

	tok, err := tokenizer.Load(cfg.Model)
	if err != nil {
		return err
	}
	m, closeModel, err := loadForwarder(cfg, tok, log) // the real model, or --simulate's
	if err != nil {
		return err
	}
	defer closeModel()
	maxLen := m.MaxModelLen()
	if cfg.MaxModelLen > 0 {
		if cfg.MaxModelLen > maxLen {
			return fmt.Errorf("--max-model-len %d is beyond the model's %d positions", cfg.MaxModelLen, maxLen)
		}
		maxLen = cfg.MaxModelLen
	}
	numBlocks := cfg.NumBlocks
	if numBlocks == 0 && cfg.KVCacheMemory == 0 {
		layout := m.KVLayout(cfg.BlockSize)
		if dt, set, _ := kvlayout.ParseElemType(cfg.KVCacheDType); set {
			layout = m.KVLayoutOf(cfg.BlockSize, dt)
		}
		numBlocks = defaultNumBlocks(layout.BlockBytes(), cfg.BlockSize, cfg.MaxNumSeqs, maxLen, totalRAM())
	}
	met := metrics.NewEngine(cfg.ServedModelName)
	conn, err := kvconnector.NewConnector(kvconnector.ConnectorConfig{
		Role:               kvconnector.Role(cfg.Role),
		EngineID:           cfg.EngineID,
		ModelFingerprint:   m.Fingerprint(),
		Host:               cfg.KVHost,
		Port:               cfg.KVPort,
		Lease:              cfg.KVLease,
		Transport:          kvxfer.Transport(cfg.KVTransport),
		Bidirectional:      cfg.KVBidirectional,
		DecodeHoldTTL:      cfg.KVDecodeHoldTTL,
		RecomputeThreshold: cmp.Or(max(cfg.KVRecomputeThreshold, 0), -1), // 0: always pull
		Secret:             cfg.kvSecret,
		Peers:              cfg.kvPeers,
		TLSServer:          cfg.kvTLSServer,
		TLSClient:          cfg.kvTLSClient,
		Metrics:            met,
		Logger:             log,
	})
	if err != nil {
		return err
	}
	var kvEvents *kvevents.Publisher
	if cfg.kvEvents != nil {
		if kvEvents, err = kvevents.NewPublisher(*cfg.kvEvents, kvevents.PublisherOptions{BlockSize: cfg.BlockSize, Logger: log}); err != nil {
			return fmt.Errorf("--kv-events-config: %w", err)
		}
		defer kvEvents.Close(time.Second) // after the engine stopped: AllBlocksCleared
		met.Registry.MustRegister(kvEvents.Collectors()...)
		log.Info("publishing KV cache events", "endpoint", cfg.kvEvents.Endpoint, "replay_endpoint", cfg.kvEvents.ReplayEndpoint, "topic", cfg.kvEvents.Topic)
	}
	eng, err := engine.New(engine.Config{
		Model:               m,
		Tokenizer:           tok,
		BlockSize:           cfg.BlockSize,
		KVCacheDType:        cfg.KVCacheDType,
		NumBlocks:           numBlocks,
		KVCacheMemory:       int64(cfg.KVCacheMemory),
		MaxNumSeqs:          cfg.MaxNumSeqs,
		MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		MaxModelLen:         maxLen,
		LoadFailurePolicy:   sched.LoadFailurePolicy(cfg.KVLoadFailurePolicy),
		Connector:           conn,
		KVWorker:            conn,
		Metrics:             met,
		Logger:              log,
		KVEvents:            kvEventSink(kvEvents),
	})
	if err != nil {
		return err
	}
	// The side channel (prefill, both) and the consumer (decode, both)
	// start before the API accepts a request.
	if err := conn.Start(eng); err != nil {
		return errors.Join(err, eng.Shutdown(context.Background()))
	}
	chat, err := openai.ChatTemplateFor(tok, cfg.chatTemplate)
	if err != nil {
		return errors.Join(fmt.Errorf("--chat-template: %w", err), eng.Shutdown(context.Background()))
	}
	var requestChat func(string) (openai.ChatTemplate, error)
	if cfg.TrustRequestChatTemplate {
		requestChat = openai.RequestChatTemplates(tok)
	}
	api, err := openai.NewServer(openai.Config{
		Backend:             eng,
		Tokenizer:           tok,
		ChatTemplate:        chat,
		RequestChatTemplate: requestChat,
		ModelName:           cfg.ServedModelName,
		ModelRoot:           cfg.Model,
		Defaults:            defaultsOf(m.GenerationConfig()),
		Metrics:             met.Handler(),
		Version:             version(),
		MaxBodyBytes:        int64(cfg.MaxRequestBody),
		Logger:              log,
		APIKey:              cfg.APIKey,
		KVReleaser:          conn, // POST /tandem/kv/release: frees a prefill's KV for a proxy whose decode leg never started
	})
	if err != nil {
		return errors.Join(err, eng.Shutdown(context.Background()))
	}

	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(fmt.Errorf("listen on %s: %w", addr, err), eng.Shutdown(context.Background()))
	}
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: either would cut long generations.
		// The API bounds each body read and each write itself.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "model", cfg.ServedModelName, "max_model_len", maxLen,
		"block_size", cfg.BlockSize, "num_blocks", numBlocks, "kv_cache_memory", int64(cfg.KVCacheMemory),
		"role", cfg.Role, "engine_id", cfg.EngineID, "kv_side_channel", conn.SideChannelAddr(),
		"max_drain", drainBound(cfg, conn)) // on SIGTERM; terminationGracePeriodSeconds should exceed it
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("http server: %w", err), eng.Shutdown(context.Background()))
	}
	return drain(log, cfg, api, eng, conn, srv)
}

// kvEventSink is p as the engine's sink, nil (not a typed nil) without one.
func kvEventSink(p *kvevents.Publisher) engine.KVEventSink {
	if p == nil {
		return nil
	}
	return p
}

// defaultNumBlocks sizes the KV cache when no flag does: room for
// maxNumSeqs sequences of the full context, capped at 20% of RAM, and never
// less than one full-length sequence. ram 0 means unknown (no cap).
func defaultNumBlocks(blockBytes, blockSize, maxNumSeqs, maxModelLen int, ram uint64) int {
	perSeq := (maxModelLen + blockSize - 1) / blockSize
	n := perSeq * maxNumSeqs
	if ram > 0 && blockBytes > 0 {
		n = min(n, int(ram/5/uint64(blockBytes)))
	}
	return max(n, perSeq)
}

// totalRAM is the memory this process may use in bytes: the machine's
// physical memory, or the cgroup's memory limit when that is lower (a
// container's limit: sizing the KV cache from the node's memory would get
// the pod OOM-killed). 0 means unknown.
func totalRAM() uint64 {
	ram := physicalRAM()
	if lim := cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup"); lim > 0 && (ram == 0 || lim < ram) {
		return lim
	}
	return ram
}

// physicalRAM is MemTotal of /proc/meminfo in bytes, or 0 if unknown.
func physicalRAM() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupMemoryLimit is the memory limit of this process's cgroup in bytes
// (cgroup v2 memory.max of its own cgroup or the nearest limited ancestor
// below root; cgroup v1 memory.limit_in_bytes), or 0 when there is none or
// it cannot be read.
func cgroupMemoryLimit(selfCgroup, root string) uint64 {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "": // cgroup v2
			for dir := filepath.Join(root, f[2]); strings.HasPrefix(dir, root) && dir != root; dir = filepath.Dir(dir) {
				if v := readLimit(filepath.Join(dir, "memory.max")); v > 0 {
					return v
				}
			}
			if v := readLimit(filepath.Join(root, "memory.max")); v > 0 {
				return v
			}
		case slices.Contains(strings.Split(f[1], ","), "memory"): // cgroup v1
			for _, p := range []string{filepath.Join(root, "memory", f[2], "memory.limit_in_bytes"), filepath.Join(root, "memory", "memory.limit_in_bytes")} {
				// v1 reports "no limit" as a huge number near 2^63.
				if v := readLimit(p); v > 0 && v < 1<<62 {
					return v
				}
			}
		}
	}
	return 0
}

// readLimit reads a cgroup limit file: a byte count, or "max" (no limit,
// 0).
func readLimit(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// defaultsOf maps generation_config.json onto the API's sampling defaults.
func defaultsOf(g model.GenerationConfig) openai.Defaults {
	return openai.Defaults{
		Temperature:       g.Temperature,
		TopP:              g.TopP,
		TopK:              g.TopK,
		MinP:              g.MinP,
		RepetitionPenalty: g.RepetitionPenalty,
		MaxNewTokens:      g.MaxNewTokens,
	}
}

// version is the module version the binary was built from.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// byteSize is a flag holding a size in bytes, written as a plain number or
// with a suffix: KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of
// 1024).
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*b), 10)
}

// Set parses s.
func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	num := s
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			mult, num = u.mult, strings.TrimSpace(strings.TrimSuffix(s, u.suffix))
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v*float64(mult) >= 1<<63 {
		return fmt.Errorf("%q is not a size: use bytes or a suffix such as 512MiB or 2GiB", s)
	}
	*b = byteSize(v * float64(mult))
	return nil
}
