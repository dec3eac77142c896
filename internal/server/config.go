package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/sim"
)

// Config is an engine process: one field per flag of `tandem serve`, named
// in the field's doc, with the flag's meaning. A flag that names a file
// (--chat-template, --kv-secret-file, the --kv-tls-* files) or holds a
// document (--kv-events-config) is here as what the command read from it.
// Validate checks the values and names the flags in its errors.
type Config struct {
	// Model is the model directory in Hugging Face layout, or a GGUF file
	// (--model).
	Model string
	// ServedModelName is the model name clients send
	// (--served-model-name); Validate defaults it to the base name of Model.
	ServedModelName string
	// Host and Port are the HTTP API's address (--host, --port); port 0
	// picks a free one (see Addr).
	Host string
	Port int

	// BlockSize is the tokens per KV-cache block (--block-size).
	BlockSize int
	// KVCacheDType is the KV-cache element type: auto, bfloat16 or float32
	// (--kv-cache-dtype).
	KVCacheDType string
	// DisableHybridKVCache keeps every layer in every KV block for a model
	// with sliding-window layers (--disable-hybrid-kv-cache-manager; see
	// engine.Config).
	DisableHybridKVCache bool
	// NumBlocks and KVCacheMemory size the KV cache in blocks or bytes
	// (--num-blocks, --kv-cache-memory), at most one of them set. With
	// neither, the cache has room for MaxNumSeqs full-length sequences,
	// capped at a fifth of the memory this process may use.
	NumBlocks     int
	KVCacheMemory int64
	// MaxNumSeqs is the most sequences in one batch (--max-num-seqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the most tokens in one step
	// (--max-num-batched-tokens).
	MaxNumBatchedTokens int
	// PrefillScheduleInterval N > 1 runs prefill compute only on every Nth
	// step while requests decode (--prefill-schedule-interval); 0 and 1
	// prefill on every step.
	PrefillScheduleInterval int
	// MaxModelLen is the context window in tokens, 0 for the model's
	// (--max-model-len).
	MaxModelLen int
	// Threads is the compute threads of the model's pool (--threads).
	Threads int

	// MaxRequestBody is the largest request body in bytes
	// (--max-request-body); larger ones get 413.
	MaxRequestBody int64
	// ShutdownTimeout is how long requests in flight may run once Run's
	// context ends (--shutdown-timeout); see drain.go.
	ShutdownTimeout time.Duration
	// APIKey, if set, is required as a bearer token on every path but
	// /health, /livez and /metrics (--api-key or $TANDEM_API_KEY).
	APIKey string

	// ChatTemplate is the text of a Jinja chat template to use in place of
	// the model's, "" for the model's (--chat-template names a file or
	// holds the text).
	ChatTemplate string
	// TrustRequestChatTemplate renders a chat request's own chat_template
	// field (--trust-request-chat-template).
	TrustRequestChatTemplate bool

	// Role is the engine's part in disaggregated prefill/decode (--role).
	Role kvconnector.Role
	// KVHost and KVPort are the KV side channel's address, listened on and
	// advertised to decode engines (--kv-host, --kv-port); port 0 picks a
	// free one (see KVAddr).
	KVHost string
	KVPort int
	// KVPortFallback makes KVPort a preference (the --kv-port default):
	// when it is taken — another engine on this host — the side channel
	// listens on a free port instead, says so in the log, and advertises
	// that port in kv_transfer_params. Without it a taken KVPort stops the
	// engine with an error naming --kv-port.
	KVPortFallback bool
	// EngineID is this engine's id in kv_transfer_params (--engine-id);
	// Validate defaults it to a fresh UUID.
	EngineID string
	// KVLease is how long a prefill holds KV that no decode has read
	// (--kv-lease).
	KVLease time.Duration
	// KVTransport is how a decode pulls KV (--kv-transport).
	KVTransport kvxfer.Transport
	// KVLoadFailurePolicy decides what a failed KV pull does
	// (--kv-load-failure-policy).
	KVLoadFailurePolicy sched.LoadFailurePolicy
	// KVBidirectional turns on multi-turn KV reuse (--kv-bidirectional).
	KVBidirectional bool
	// KVDecodeHoldTTL is how long a decode holds a conversation's KV for
	// its next turn (--kv-decode-hold-ttl).
	KVDecodeHoldTTL time.Duration
	// KVRecomputeThreshold is the history length below which a prefill
	// computes rather than pulls (--kv-recompute-threshold); 0 or less
	// always pulls.
	KVRecomputeThreshold int
	// KVSecret is the cluster's KV secret (read from --kv-secret-file or
	// $TANDEM_KV_SECRET by kvxfer.LoadSecret); the zero Secret is none.
	KVSecret kvxfer.Secret
	// KVPeers is the side channel's address allowlist (--kv-peers, parsed
	// by kvxfer.ParsePeers); nil is loopback only without a KVSecret and
	// any address with one.
	KVPeers *kvxfer.PeerPolicy
	// KVTLSServer and KVTLSClient, if set, wrap the side channel in mutual
	// TLS (--kv-tls-cert, --kv-tls-key and --kv-tls-ca, loaded by
	// kvxfer.TLSConfigs).
	KVTLSServer, KVTLSClient *tls.Config

	// KVEvents, if set, publishes KV cache events as vLLM does
	// (--kv-events-config, parsed by kvevents.ParseConfig).
	KVEvents *kvevents.Config

	// Simulate, if set, replaces the model's forward pass with a simulated
	// one (--simulate and the --sim-* flags).
	Simulate *Simulation

	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// LoadProgress, when set, is told the bytes of weights read while the
	// model loads (model.LoadOptions.Progress; --progress).
	LoadProgress func(read, total int64)
	// Version is the build's version, reported by the API.
	Version string
}

// Simulation is a simulated engine (`tandem serve --simulate`): the engine
// is real, its forward pass is internal/sim's, shaped by the model
// directory's config.json and tokenizer.
type Simulation struct {
	// Profile is the time model: a profile file written by `tandem profile`
	// (--simulate PROFILE.json), or "" for the built-in profile (--simulate
	// alone).
	Profile string
	// Knobs, if set, is the simple time model in place of a profile
	// (--sim-ttft, --sim-itl, --sim-prefill-per-token).
	Knobs *sim.Knobs
	// Speed runs simulated time this many times faster than real time
	// (--sim-speed).
	Speed float64
	// Seed is the simulated model's seed (--sim-seed).
	Seed uint64
	// MeanOutputLen is the mean answer length before EOS, 0 for never
	// (--sim-mean-output-len).
	MeanOutputLen int
	// Faults are the injected faults (--sim-error-rate, --sim-stall-every,
	// --sim-stall-for, --sim-kv-delay, --sim-kv-fail-rate,
	// --sim-kv-corrupt-rate, --sim-crash-after).
	Faults sim.Faults
	// OnModel, if set, receives the simulated model once it is built, for
	// tests that read its Stats.
	OnModel func(*sim.Model)
}

// Validate checks c and fills in the defaults that depend on other fields
// or on the process: ServedModelName (the base name of Model) and EngineID
// (a fresh UUID). Its errors name the flags of `tandem serve`. New calls
// it; the command calls it too, to report a bad flag before reading the
// files the flags name.
func (c *Config) Validate() error {
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
	case c.KVCacheMemory < 0:
		return errors.New("--kv-cache-memory must not be negative")
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("--max-num-seqs must be at least 1, got %d", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("--max-num-batched-tokens must be at least 1, got %d", c.MaxNumBatchedTokens)
	case c.PrefillScheduleInterval < 0:
		return fmt.Errorf("--prefill-schedule-interval must be at least 1 (1: prefill on every step), got %d", c.PrefillScheduleInterval)
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
	if _, err := kvconnector.ParseRole(string(c.Role)); err != nil {
		return fmt.Errorf("--role: %w", err)
	}
	switch c.KVTransport {
	case kvxfer.TransportAuto, kvxfer.TransportTCP, kvxfer.TransportShm:
	default:
		return fmt.Errorf("--kv-transport %q: use auto, tcp or shm", c.KVTransport)
	}
	switch c.KVLoadFailurePolicy {
	case sched.LoadFailureFail, sched.LoadFailureRecompute:
	default:
		return fmt.Errorf("--kv-load-failure-policy %q: use fail or recompute", c.KVLoadFailurePolicy)
	}
	if c.EngineID == "" {
		c.EngineID = uuid.NewString()
	}
	if c.ServedModelName == "" {
		c.ServedModelName = filepath.Base(filepath.Clean(c.Model))
	}
	return nil
}
