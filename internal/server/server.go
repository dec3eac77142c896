package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Server is one engine process. Run it once.
type Server struct {
	cfg   Config
	log   *slog.Logger
	ready chan struct{}
	// Set before ready is closed.
	addr, kvAddr string
}

// New checks cfg (see Config.Validate) and returns the engine it
// describes; nothing is loaded or bound before Run.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, ready: make(chan struct{})}, nil
}

// Config is the server's configuration, with the defaults Validate filled
// in.
func (s *Server) Config() Config { return s.cfg }

// Ready is closed once the engine serves: the model is loaded, the KV side
// channel and the HTTP API listen, and Addr and KVAddr answer.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the HTTP API's address (host:port) once Ready is closed.
func (s *Server) Addr() string { return s.addr }

// KVAddr is the KV side channel's advertised address (host:port) once
// Ready is closed, or "" for an engine that serves no KV (a decode).
func (s *Server) KVAddr() string { return s.kvAddr }

// Run runs the engine and its API until ctx ends, then drains (see
// drain.go): /health turns 503, requests in flight get
// Config.ShutdownTimeout to finish (the rest are aborted), a prefill serves
// its held KV until it is read or its lease ends, then the listener closes.
// It returns nil when nothing had to be cut short.
func (s *Server) Run(ctx context.Context) error {
	cfg, log := &s.cfg, s.log
	tok, err := tokenizer.Load(cfg.Model)
	if err != nil {
		return err
	}
	m, closeModel, err := loadForwarder(cfg, tok, log) // the real model, or a simulated one
	if err != nil {
		return err
	}
	defer closeModel()
	maxLen, numBlocks, err := s.size(m)
	if err != nil {
		return err
	}
	met := metrics.NewEngine(cfg.ServedModelName)
	met.SetInfo(cmp.Or(string(cfg.Role), string(kvconnector.RoleBoth)), cfg.MaxNumSeqs, cmp.Or(cfg.MaxNumBatchedTokens, sched.DefaultMaxNumBatchedTokens))
	conn, err := s.connector(m, met)
	if err != nil {
		return err
	}
	var kvEvents *kvevents.Publisher
	if cfg.KVEvents != nil {
		if kvEvents, err = kvevents.NewPublisher(*cfg.KVEvents, kvevents.PublisherOptions{BlockSize: cfg.BlockSize, Logger: log}); err != nil {
			return fmt.Errorf("--kv-events-config: %w", err)
		}
		defer kvEvents.Close(time.Second) // after the engine stopped: AllBlocksCleared
		met.Registry.MustRegister(kvEvents.Collectors()...)
		log.Info("publishing KV cache events", "endpoint", cfg.KVEvents.Endpoint, "replay_endpoint", cfg.KVEvents.ReplayEndpoint, "topic", cfg.KVEvents.Topic)
	}
	eng, err := engine.New(engine.Config{
		Model:               m,
		Tokenizer:           tok,
		BlockSize:           cfg.BlockSize,
		KVCacheDType:        cfg.KVCacheDType,
		NumBlocks:           numBlocks,
		KVCacheMemory:       cfg.KVCacheMemory,
		MaxNumSeqs:          cfg.MaxNumSeqs,
		MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		MaxModelLen:         maxLen,
		LoadFailurePolicy:   cfg.KVLoadFailurePolicy,
		Connector:           conn,
		KVWorker:            conn,
		Metrics:             met,
		Logger:              log,
		KVEvents:            kvEventSink(kvEvents),

		PrefillScheduleInterval: cfg.PrefillScheduleInterval,
		DisableHybridKVCache:    cfg.DisableHybridKVCache,
	})
	if err != nil {
		return err
	}
	// The side channel (prefill, both) and the consumer (decode, both)
	// start before the API accepts a request.
	if err := conn.Start(eng); err != nil {
		return errors.Join(err, eng.Shutdown(context.Background()))
	}
	api, err := s.api(tok, m, eng, conn, met)
	if err != nil {
		return errors.Join(err, eng.Shutdown(context.Background()))
	}

	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(fmt.Errorf("listen on %s: %w", addr, err), eng.Shutdown(context.Background()))
	}
	srv := &http.Server{
		Handler:           withCadenceRoute(api, eng, cfg.APIKey),
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: either would cut long generations.
		// The API bounds each body read and each write itself.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "model", cfg.ServedModelName, "max_model_len", maxLen,
		"block_size", cfg.BlockSize, "num_blocks", numBlocks, "kv_cache_memory", cfg.KVCacheMemory,
		"role", cfg.Role, "engine_id", cfg.EngineID, "kv_side_channel", conn.SideChannelAddr(),
		"max_drain", drainBound(cfg, conn)) // on SIGTERM; terminationGracePeriodSeconds should exceed it
	s.addr, s.kvAddr = ln.Addr().String(), conn.SideChannelAddr()
	close(s.ready)

	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("http server: %w", err), eng.Shutdown(context.Background()))
	}
	return drain(log, cfg, api, eng, conn, srv)
}

// size is the context window and the KV cache's blocks: the flags', else
// room for MaxNumSeqs full-length sequences within a fifth of the memory
// this process may use. 0 blocks leaves the engine to size the cache from
// KVCacheMemory.
func (s *Server) size(m engine.Forwarder) (maxLen, numBlocks int, err error) {
	cfg := &s.cfg
	maxLen = m.MaxModelLen()
	if cfg.MaxModelLen > 0 {
		if cfg.MaxModelLen > maxLen {
			return 0, 0, fmt.Errorf("--max-model-len %d is beyond the model's %d positions", cfg.MaxModelLen, maxLen)
		}
		maxLen = cfg.MaxModelLen
	}
	numBlocks = cfg.NumBlocks
	if numBlocks == 0 && cfg.KVCacheMemory == 0 {
		layout, windows, err := engine.PoolLayout(m, cfg.BlockSize, cfg.KVCacheDType, cfg.DisableHybridKVCache)
		if err != nil {
			return 0, 0, err
		}
		// With hybrid KV-cache groups a full-length sequence holds
		// kvlayout.SeqBlocks blocks (of one group's layers each), not one
		// block of every layer per BlockSize tokens: size for that many.
		seqTokens := kvlayout.SeqBlocks(windows, layout.BlockSize, maxLen, cmp.Or(cfg.MaxNumBatchedTokens, sched.DefaultMaxNumBatchedTokens)) * layout.BlockSize
		numBlocks = defaultNumBlocks(layout.BlockBytes(), layout.BlockSize, cfg.MaxNumSeqs, seqTokens, totalRAM())
	}
	return maxLen, numBlocks, nil
}

// connector is the engine's KV connector for its role: the side channel of
// a prefill, the consumer of a decode.
func (s *Server) connector(m engine.Forwarder, met *metrics.Engine) (*kvconnector.Connector, error) {
	cfg := &s.cfg
	return kvconnector.NewConnector(kvconnector.ConnectorConfig{
		Role:               cfg.Role,
		EngineID:           cfg.EngineID,
		ModelFingerprint:   m.Fingerprint(),
		Kernels:            tensor.ISA(),
		Host:               cfg.KVHost,
		Port:               s.kvPort(),
		Lease:              cfg.KVLease,
		Transport:          cfg.KVTransport,
		Bidirectional:      cfg.KVBidirectional,
		DecodeHoldTTL:      cfg.KVDecodeHoldTTL,
		RecomputeThreshold: cmp.Or(max(cfg.KVRecomputeThreshold, 0), -1), // 0: always pull
		Secret:             cfg.KVSecret,
		Peers:              cfg.KVPeers,
		TLSServer:          cfg.KVTLSServer,
		TLSClient:          cfg.KVTLSClient,
		Metrics:            met,
		Logger:             s.log,
	})
}

// api is the OpenAI-compatible HTTP API over eng.
func (s *Server) api(tok *tokenizer.Tokenizer, m engine.Forwarder, eng *engine.Engine, conn *kvconnector.Connector, met *metrics.Engine) (*openai.Server, error) {
	cfg := &s.cfg
	chat, err := openai.ChatTemplateFor(tok, cfg.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("--chat-template: %w", err)
	}
	var requestChat func(string) (openai.ChatTemplate, error)
	if cfg.TrustRequestChatTemplate {
		requestChat = openai.RequestChatTemplates(tok)
	}
	return openai.NewServer(openai.Config{
		Backend:             eng,
		Tokenizer:           tok,
		ChatTemplate:        chat,
		RequestChatTemplate: requestChat,
		ModelName:           cfg.ServedModelName,
		ModelRoot:           cfg.Model,
		Defaults:            defaultsOf(m.GenerationConfig()),
		Metrics:             met.Handler(),
		Version:             cfg.Version,
		MaxBodyBytes:        cfg.MaxRequestBody,
		Logger:              s.log,
		APIKey:              cfg.APIKey,
		KVReleaser:          conn, // POST /tandem/kv/release: frees a prefill's KV for a proxy whose decode leg never started
		KVReleased:          func(reason string) { met.KVReleases.WithLabelValues(reason).Inc() },
	})
}

// kvEventSink is p as the engine's sink, nil (not a typed nil) without one.
func kvEventSink(p *kvevents.Publisher) engine.KVEventSink {
	if p == nil {
		return nil
	}
	return p
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
