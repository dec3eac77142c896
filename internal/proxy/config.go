package proxy

import (
	"log/slog"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Config and its defaults: every field with the default it takes when left
// zero (setDefaults), and the policy names and defaults the commands route
// with (Policies, DefaultPolicy, DefaultPDDecider).

// Config configures a Proxy. Zero durations and sizes take the defaults
// documented on each field.
type Config struct {
	// Prefill and Decode are the engines' base URLs ("http://host:port" or
	// "host:port"). Each needs at least one, but for Prefill under a
	// decider that keeps prompts local with no prefill engine (conditional
	// or priced, KeepsLocalWithoutPrefill): none is then the colocated
	// split, every decode prefilling its own prompts (reason colocated),
	// and the planner, when it acts, may move engines into the prefill
	// pool from there.
	Prefill []string
	Decode  []string
	// Policy names the picking pipeline for both pools; see Policies.
	// Default "round-robin".
	Policy string
	// PrefillProfile and DecodeProfile, when set, replace Policy's pipeline
	// for that pool with one spelled out plugin by plugin (the YAML config
	// file's profiles).
	PrefillProfile, DecodeProfile *factory.Spec
	// PDDecider decides per request between remote and local prefill:
	// "always" (default), "conditional" or "priced" (see packages
	// router/decider/conditional and router/decider/priced and Router's
	// fields).
	PDDecider string
	// Router holds the plugins' knobs: saturation limits and the
	// conditional decider's thresholds.
	Router factory.Options
	// ScrapeInterval is the period of scraping each engine's /metrics for
	// its queue and KV usage (default 250ms; negative: off). Values older
	// than three intervals, or than one interval plus ScrapeTimeout when
	// that is longer, are ignored.
	ScrapeInterval time.Duration
	// ScrapeTimeout bounds one scrape (default 2s). It is its own bound,
	// not the interval: an engine busy computing (vLLM's API server on
	// shared cores) answers /metrics later than a 250ms interval, and a
	// scrape cut at the interval then fails every time.
	ScrapeTimeout time.Duration
	// PrefillRetries is how many other prefill engines a failed prefill leg
	// is retried on (within Timeout) before falling back. Default 1;
	// negative: none.
	PrefillRetries int
	// DecodeRetries is how many other decode engines a decode leg that
	// failed before its first byte is retried on. Default 1; negative: none.
	DecodeRetries int
	// QueueTimeout is how long a request waits when every candidate engine
	// is saturated before a 429 (default 2s), and MaxQueue how many may wait
	// at once (default 1024; beyond, 429 at once).
	QueueTimeout time.Duration
	MaxQueue     int
	// BackendsFile, when set, is a file listing backends, one "prefill URL"
	// or "decode URL" per line ('#' starts a comment), watched every
	// HealthInterval: the pools follow it without a restart. Prefill and
	// Decode may then be empty at start.
	BackendsFile string
	// BackendsChanged, when set, is told of each change SetBackends makes
	// to a pool (the backends file, the admin endpoint, discovery): the
	// base URLs added and removed, normalized as NormalizeBackendURL does.
	// It runs before SetBackends returns (the added backends are not yet
	// health-checked); the initial Prefill and Decode are not reported.
	// The KV-event index follows decodes that come and go through it
	// (kvindex.Follower).
	BackendsChanged func(role string, added, removed []string)
	// DynamicBackends says that discovery outside the proxy (package
	// kubediscovery, through SetBackends) keeps the pools: Prefill and
	// Decode may then be empty at start, and serve, when given, until
	// discovery's first set.
	DynamicBackends bool
	// Tokenizer, when set, is the model's tokenizer: the router then counts
	// prompt tokens exactly and matches prefixes block by block as the
	// engines cache them. Nil: approximate counts (bytes/4), said in the log
	// and in tandem:proxy_token_count_mode.
	Tokenizer *tokenizer.Tokenizer
	// PrefixIndex, when set, is a precise prefix index (the engines' KV
	// events: package router/kvindex) used in place of the router's own
	// approximate record; BlockHasher then computes the engines' block
	// hashes from a prompt's token ids. Both need Tokenizer.
	PrefixIndex prefix.Index
	BlockHasher func(ids []int32) []uint64
	// BlockSize is the engines' block size in tokens, for prefix hashes and
	// cached-token counts (default 16).
	BlockSize int
	// Fallback sends a request to decode alone (full local prefill) when the
	// prefill leg fails, saying so in x-tandem-pd. When false such a request
	// fails with 502/503/504 instead, for benchmarks that must not measure a
	// silently different path.
	Fallback bool
	// ConnectTimeout bounds dialing a backend. Default 5s.
	ConnectTimeout time.Duration
	// Timeout bounds waiting on a backend: the whole prefill leg (its
	// retries on other engines share the budget), and caps
	// FirstByteTimeout and StallTimeout. There is no limit on a stream's
	// total length. Default 5m.
	Timeout time.Duration
	// FirstByteTimeout bounds how long a leg may go without its first byte:
	// a prefill attempt's answer (it comes whole), and a decode attempt's
	// headers and first body byte (the first token of a stream; an answer
	// that does not stream comes whole at the end, so it gets one second
	// more per max_tokens). An attempt that misses it is retried on another
	// engine (a decode leg then without kv_transfer_params, see
	// docs/kv-transfer.md, "The transfer contract") or fails with 504.
	// Default 60s; Timeout caps it. Raise it for engines whose longest
	// prompts, queued, take longer to their first token.
	FirstByteTimeout time.Duration
	// StallTimeout bounds each gap between two chunks of the decode's body
	// after its first byte; a stream silent for longer is cut (the client
	// sees an aborted answer). Default 30s; Timeout caps it.
	StallTimeout time.Duration
	// CanceledPrefillGrace is how long a prefill leg whose client went away
	// is still given to answer: the proxy then releases the KV the answer
	// holds at once, instead of leaving it to the lease. Past it the leg is
	// cancelled (the engine aborts it; KV it holds by then waits for the
	// lease). Default 2s; negative: cancel at once.
	CanceledPrefillGrace time.Duration
	// MaxBodyBytes caps a client request body (413 beyond). Default
	// DefaultMaxBodyBytes (15 MiB): the engines' 16 MiB less what the proxy
	// adds to a leg's body. Set the engines' limit at least MaxLegGrowth
	// above it.
	MaxBodyBytes int64
	// HealthInterval is the period of backend health checks (default 2s) and
	// HealthTimeout the limit on each (default 2s).
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	// Logger receives one structured line per notable event. Default
	// slog.Default().
	Logger *slog.Logger
	// APIKey, when set, is required from clients as "Authorization: Bearer
	// <key>" on every path but /health and /metrics. Never logged.
	APIKey string
	// BackendAPIKey is sent to every backend as "Authorization: Bearer
	// <key>" (legs, /v1/models, health checks, KV releases), replacing the
	// client's Authorization header. Default: APIKey, since `tandem up` and
	// most deployments use one key for all. When both are empty the client's
	// Authorization header is passed through to the engines.
	BackendAPIKey string
	// ReleaseTimeout bounds a call to a prefill's /tandem/kv/release.
	// Default 2s.
	ReleaseTimeout time.Duration
	// Conversations turns on conversation mode, for decode engines started
	// with --kv-bidirectional: a request naming a conversation (body field
	// conversation_id or header X-Conversation-Id) has the kv_transfer_params
	// its decode returned remembered, and the conversation's next turn sends
	// them on its prefill leg, so the prefill pulls the history's KV from
	// that decode instead of recomputing it, and routes its decode leg to
	// the same decode. Off: conversation_id reaches the engines like any
	// other field and nothing is remembered.
	Conversations bool
	// ConversationMaxEntries bounds the conversations remembered; the least
	// recently used one makes room. Default 10000.
	ConversationMaxEntries int
	// ConversationTTL is how long a conversation is remembered when the
	// decode's params carry no remote_blocks_expiry_time. Default 480s, the
	// decodes' default hold (vLLM's decoder_kv_blocks_ttl).
	ConversationTTL time.Duration
	// ConversationMinPrefixTokens: with Tokenizer, a request naming no
	// conversation continues a remembered history (the turns of such
	// requests are remembered by their history's block hashes) when its
	// prompt starts with at least this many of its tokens, in whole blocks;
	// the longest match wins. Default 64, the engines' default
	// --kv-recompute-threshold: a shorter history is computed, not pulled.
	ConversationMinPrefixTokens int
	// Planner, when set, runs the pool planner (package planner) on the
	// traffic the proxy routes and the engines' scraped costs: every
	// PlanInterval it decides the P:D split, the conditional decider's
	// threshold (used at once when PDDecider is "conditional") and a
	// prefill cadence, publishes them (tandem:planner_* metrics, GET
	// /tandem/plan, OnPlan) and, with PlannerAct, acts on the split. Its
	// Engines and Prefill default to the backends given. It needs the
	// scrape (ScrapeInterval not negative).
	Planner *planner.Config
	// PlannerAct moves engines between the pools as the planner decides:
	// each joins its new pool at once and is not moved again until its old
	// role's work has ended (at most DrainTimeout).
	// The engines must serve both roles (tandem serve --role both, the
	// default); the backends must be static (no BackendsFile or
	// DynamicBackends). Off: the planner only publishes.
	PlannerAct bool
	// PlanInterval is the period of the planner's decisions (default 5s);
	// DrainTimeout bounds how long a moved engine's old role's work is
	// waited for before it may be moved again (default 2m).
	PlanInterval, DrainTimeout time.Duration
	// OnPlan, when set, is told of each decision (Kubernetes scaling,
	// package kubediscovery). It runs on the planner's goroutine.
	OnPlan func(planner.Decision)
}

func (c *Config) setDefaults() {
	if c.Policy == "" {
		c.Policy = factory.PolicyRoundRobin
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = 250 * time.Millisecond
	}
	if c.ScrapeTimeout <= 0 {
		c.ScrapeTimeout = defaultScrapeTimeout
	}
	if c.PrefillRetries == 0 {
		c.PrefillRetries = 1
	}
	if c.DecodeRetries == 0 {
		c.DecodeRetries = 1
	}
	if c.QueueTimeout <= 0 {
		c.QueueTimeout = 2 * time.Second
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 1024
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.FirstByteTimeout <= 0 {
		c.FirstByteTimeout = defaultFirstByteTimeout
	}
	c.FirstByteTimeout = min(c.FirstByteTimeout, c.Timeout)
	if c.StallTimeout <= 0 {
		c.StallTimeout = defaultStallTimeout
	}
	c.StallTimeout = min(c.StallTimeout, c.Timeout)
	if c.CanceledPrefillGrace == 0 {
		c.CanceledPrefillGrace = defaultCanceledPrefillGrace
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 2 * time.Second
	}
	if c.HealthTimeout <= 0 {
		c.HealthTimeout = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.BackendAPIKey == "" {
		c.BackendAPIKey = c.APIKey
	}
	if c.ReleaseTimeout <= 0 {
		c.ReleaseTimeout = 2 * time.Second
	}
	if c.ConversationMaxEntries <= 0 {
		c.ConversationMaxEntries = defaultConvMaxItems
	}
	if c.ConversationTTL <= 0 {
		c.ConversationTTL = defaultConvTTL
	}
	if c.PlanInterval <= 0 {
		c.PlanInterval = defaultPlanInterval
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = defaultDrainTimeout
	}
	if c.ConversationMinPrefixTokens <= 0 {
		c.ConversationMinPrefixTokens = defaultMinPrefixTokens
	}
}

// Defaults of the legs' deadlines (Config).
const (
	defaultFirstByteTimeout     = time.Minute
	defaultStallTimeout         = 30 * time.Second
	defaultCanceledPrefillGrace = 2 * time.Second
)

// Policies returns the names accepted by Config.Policy, sorted.
func Policies() []string { return factory.Policies() }

// DefaultPolicy and DefaultPDDecider are what `tandem proxy` and `tandem up`
// route with unless told otherwise: prefix- and load-aware picking and a
// remote prefill only when it pays, priced per request from the engines'
// measured costs (the conditional decider's threshold until a cost is
// measured), the configuration the measurements in docs/usage/routing.md
// favour for general traffic, with and without the planner. Config's own
// zero values stay round-robin and always (vLLM's toy proxy), for a library
// user who spells out what the proxy does.
const (
	DefaultPolicy    = factory.PolicyPrefix
	DefaultPDDecider = priced.Name
)

// KeepsLocalWithoutPrefill says whether the disaggregation decider named
// prefills every prompt on its decode when no prefill engine is free: the
// conditional and priced deciders do, always does not. Only under such a
// decider may Config.Prefill be empty.
func KeepsLocalWithoutPrefill(decider string) bool { return keepsLocalWithoutPrefill(decider) }

// defaultScrapeTimeout is Config.ScrapeTimeout's default.
const defaultScrapeTimeout = 2 * time.Second
