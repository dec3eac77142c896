package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/httpguard"
	"github.com/tandem-serve/tandem/internal/httpleg"
	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/filter/saturated"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Config configures a Proxy. Zero durations and sizes take the defaults
// documented on each field.
type Config struct {
	// Prefill and Decode are the engines' base URLs ("http://host:port" or
	// "host:port"). Each needs at least one.
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

func profileOf(policy, role string, spec *factory.Spec, o factory.Options) (*router.Profile, error) {
	if spec != nil {
		prof, err := factory.FromSpec(*spec, o)
		if err != nil {
			return nil, fmt.Errorf("%s profile: %w", role, err)
		}
		return prof, nil
	}
	return factory.Profile(policy, role, o)
}

// approxBlocksPerEngine bounds the approximate prefix index per engine:
// 8192 blocks of 16 tokens is 131k tokens, about a CPU engine's KV cache.
const approxBlocksPerEngine = 8192

// usesPrefix reports whether a pipeline has the prefix scorer.
func usesPrefix(prof *router.Profile) bool {
	for _, s := range prof.Scorers {
		if s.Name == prefix.Name {
			return true
		}
	}
	return false
}

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

// defaultScrapeTimeout is Config.ScrapeTimeout's default.
const defaultScrapeTimeout = 2 * time.Second

// Proxy is the disaggregated prefill/decode router. It is an http.Handler
// serving /v1/completions, /v1/chat/completions, /v1/models, /health and
// /metrics; Serve runs it with its health checker.
type Proxy struct {
	cfg     Config
	key     *apierror.APIKey
	log     *slog.Logger
	prefill *pool
	decode  *pool
	metrics *metrics
	// legs are the engines' costs as measured from the proxy's own legs
	// (observePrefillLeg), shared with the pools.
	legs    *legBook
	client  *http.Client // backend calls; deadlines come from contexts
	mux     *http.ServeMux
	guarded http.Handler   // serve behind package httpguard's checks
	bg      sync.WaitGroup // KV releases still running
	convs   *conversations // conversation mode's memory; nil when off
	plan    *planState     // the pool planner; nil when off
	decider router.Decider
	prefix  *prefix.Approx // the router's own record of where prefixes went
	// observePrefix says whether answered requests are recorded in prefix.
	observePrefix bool
	// matchHistories says whether conversation mode matches requests
	// naming no conversation by prompt prefix (it needs the tokenizer).
	matchHistories bool
	// saturation is the not-saturated filter's test, for the decider's
	// view of the prefill pool.
	saturation *saturated.Filter
	queued     chan struct{} // admission control: one token per waiting request
	now        func() time.Time
	// betweenLegs, when set by a test, runs after a prefill leg that
	// returned kv_transfer_params and before the decode leg.
	betweenLegs func(ctx context.Context)
	// afterFunc, when set by a test, starts the decode attempts' watchdogs
	// in place of time.AfterFunc.
	afterFunc func(d time.Duration, f func()) *time.Timer
}

// New validates cfg and returns a Proxy whose backends are all unhealthy
// until the first health check (CheckHealth, or Serve) has passed.
func New(cfg Config) (*Proxy, error) {
	cfg.setDefaults()
	m := newMetrics()
	pp, err := profileOf(cfg.Policy, rolePrefill, cfg.PrefillProfile, cfg.Router)
	if err != nil {
		return nil, err
	}
	dp, err := profileOf(cfg.Policy, roleDecode, cfg.DecodeProfile, cfg.Router)
	if err != nil {
		return nil, err
	}
	if (cfg.PrefixIndex != nil || cfg.BlockHasher != nil) && (cfg.Tokenizer == nil || cfg.PrefixIndex == nil || cfg.BlockHasher == nil) {
		return nil, errors.New("a precise prefix index (KV events) needs the model's tokenizer (--model DIR) and the engines' block hasher")
	}
	dec, err := factory.Decider(cfg.PDDecider, cfg.Router)
	if err != nil {
		return nil, err
	}
	dynamic := cfg.BackendsFile != "" || cfg.DynamicBackends
	legs := newLegBook()
	pre, err := newPool(rolePrefill, cfg.Prefill, pp, m, legs, dynamic)
	if err != nil {
		return nil, err
	}
	dpool, err := newPool(roleDecode, cfg.Decode, dp, m, legs, dynamic)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		key:        apierror.NewAPIKey(cfg.APIKey),
		cfg:        cfg,
		log:        cfg.Logger,
		prefill:    pre,
		decode:     dpool,
		legs:       legs,
		decider:    dec,
		prefix:     prefix.NewApprox(approxBlocksPerEngine),
		saturation: factory.Saturation(cfg.Router),
		queued:     make(chan struct{}, cfg.MaxQueue),
		metrics:    m,
		client:     &http.Client{Transport: newLegTransport(cfg.ConnectTimeout)},
		now:        time.Now,
	}
	if cfg.Conversations {
		p.initConversations()
	}
	if cfg.Planner != nil {
		if cfg.ScrapeInterval < 0 {
			return nil, errors.New("the planner fits the engines' scraped costs: it needs the scrape on (a --scrape-interval above 0)")
		}
		if err := p.initPlanner(); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", p.handleGenerate)
	mux.HandleFunc("/v1/chat/completions", p.handleGenerate)
	mux.HandleFunc("/v1/models", p.handleModels)
	mux.HandleFunc("/health", p.handleHealth)
	mux.HandleFunc(AdminBackendsPath, p.handleAdminBackends)
	mux.HandleFunc(PlanPath, p.handlePlan)
	mux.Handle("GET /metrics", m.handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// Unknown paths are refused rather than passed to a decode engine:
		// passing them would silently skip the P/D path.
		writeError(w, http.StatusNotFound,
			fmt.Sprintf("%s is not served by the tandem proxy; it serves /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics", r.URL.Path))
	})
	p.mux = mux
	p.guarded = httpguard.Wrap(p.mux, httpguard.Options{JSONPaths: generationPaths, Authorize: p.key.Check})
	// A scrape that takes up to its timeout lands that much after its
	// tick: values are stale only past the later of the two bounds.
	stale := max(3*cfg.ScrapeInterval, cfg.ScrapeInterval+cfg.ScrapeTimeout)
	if cfg.ScrapeInterval < 0 {
		stale = 0
	}
	for _, pl := range []*pool{pre, dpool} {
		pl.stale = stale
	}
	// Prefix matching costs a lookup per request and memory per block sent:
	// only when a scorer or the decider uses it.
	if usesPrefix(dp) || cfg.PDDecider == conditional.Name || cfg.PDDecider == priced.Name {
		dpool.prefix = p.matchPrefix
		p.observePrefix = cfg.PrefixIndex == nil
	}
	if cfg.Tokenizer != nil {
		m.tokenMode.WithLabelValues("exact").Set(1)
		m.tokenMode.WithLabelValues("approximate").Set(0)
	} else {
		m.tokenMode.WithLabelValues("exact").Set(0)
		m.tokenMode.WithLabelValues("approximate").Set(1)
	}
	p.cfg.APIKey = "" // the digest in p.key is all the proxy keeps of it
	if cfg.BackendsFile != "" {
		if err := p.loadBackendsFile(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// newLegTransport is the one transport shared by all backend calls: legs,
// health checks, scrapes, KV releases. Plain http:// backends are served by
// package httpleg, which does each exchange on the calling goroutine (net/http's
// per-connection reader and writer goroutines and their channel handoffs were
// about 40% of the proxy's CPU); https backends go to newTransport's.
// Backends are few and long-lived, so both keep up to 256 idle connections
// per host, to avoid a handshake per request under load.
func newLegTransport(connect time.Duration) *httpleg.Transport {
	return &httpleg.Transport{
		Fallback:            newTransport(connect),
		ConnectTimeout:      connect,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
}

// newTransport is net/http's transport for the backends httpleg does not
// serve (https). Compression is off: SSE must not be buffered by a gzip
// layer and the prefill answer is small.
func newTransport(connect time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:                 nil, // backends are addressed directly, never via HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   connect,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}

// MetricsRegisterer is the registry behind the proxy's /metrics, for
// collectors of the parts wired around it (discovery) to appear there.
func (p *Proxy) MetricsRegisterer() prometheus.Registerer { return p.metrics.registry }

// generationPaths are the routes that take a client's JSON body.
var generationPaths = []string{"/v1/completions", "/v1/chat/completions"}

// ServeHTTP checks the request's framing, the API key, and a generation
// request's content type and UTF-8 (package httpguard: a body that is not
// application/json is a 415), then routes it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.guarded.ServeHTTP(w, r)
}

// CheckHealth checks every backend once, concurrently, and returns when all
// checks are done.
func (p *Proxy) CheckHealth(ctx context.Context) {
	var wg sync.WaitGroup
	for _, pl := range []*pool{p.prefill, p.decode} {
		for _, b := range pl.list() {
			wg.Go(func() { checkBackend(ctx, p.client, b, p.cfg.HealthTimeout, p.cfg.BackendAPIKey, p.log) })
		}
	}
	wg.Wait()
}

// Ready reports whether the proxy can serve: a decode backend is healthy,
// and so is a prefill backend, unless it lists none and Fallback is on or
// the planner may have chosen none (decodes only: every request is served
// on a decode, as a colocated engine, and was served while /health said
// 503). With prefills listed but none healthy it is not ready.
func (p *Proxy) Ready() bool {
	if !p.decode.anyHealthy() {
		return false
	}
	return p.prefill.anyHealthy() || ((p.cfg.Fallback || p.colocated()) && len(p.prefill.list()) == 0)
}

// runHealth checks the backends now and then every HealthInterval until ctx
// is done.
func (p *Proxy) runHealth(ctx context.Context) {
	t := time.NewTicker(p.cfg.HealthInterval)
	defer t.Stop()
	for {
		p.CheckHealth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// shutdownGrace is how long Serve lets open requests finish once ctx is done.
const shutdownGrace = 10 * time.Second

// Serve serves on ln and checks backend health in the background until ctx
// is done; then it stops accepting, gives open requests shutdownGrace to
// finish, closes the rest and returns nil. It returns the server's error if
// serving fails for another reason.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler: p,
		// No ReadTimeout or WriteTimeout: both would cut long streams. The
		// body read and each relayed chunk get their own deadlines instead.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	hctx, stopHealth := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.runHealth(hctx) })
	if p.cfg.BackendsFile != "" {
		wg.Go(func() { p.watchBackendsFile(hctx) })
	}
	if p.cfg.ScrapeInterval > 0 {
		wg.Go(func() { p.runScrape(hctx) })
	}
	if p.plan != nil {
		wg.Go(func() { p.runPlanner(hctx) })
	}
	defer func() {
		stopHealth()
		wg.Wait()
		p.releaseConversations()
		p.bg.Wait()
		p.client.CloseIdleConnections()
	}()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("proxy server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("proxy server: %w", err)
	}
	return nil
}

// healthBody is the JSON answer of /health.
type healthBody struct {
	Status  string         `json:"status"` // "ok" or "unavailable"
	Prefill []backendState `json:"prefill"`
	Decode  []backendState `json:"decode"`
}

func (p *Proxy) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "use GET /health")
		return
	}
	body := healthBody{Status: "ok", Prefill: p.prefill.states(), Decode: p.decode.states()}
	status := http.StatusOK
	if !p.Ready() {
		body.Status = "unavailable"
		status = http.StatusServiceUnavailable
	}
	b, _ := json.MarshalIndent(body, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// handleModels relays a healthy decode backend's /v1/models: the decode
// engines are the ones that answer the client, so theirs is the truth.
func (p *Proxy) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "use GET /v1/models")
		return
	}
	b, done, _ := p.decode.pick(&router.Request{Path: r.URL.Path}, 0)
	if b != nil {
		defer done()
	}
	if b == nil {
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see /health")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/v1/models", nil)
	if err != nil {
		p.writeInternalError(w, "", "building the /v1/models call", err)
		return
	}
	p.setBackendHeaders(req.Header, r.Header)
	resp, err := p.client.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			markDown(b, err, p.log)
		}
		writeError(w, http.StatusBadGateway, fmt.Sprintf("decode backend %s: %v", b.base, err))
		return
	}
	defer resp.Body.Close()
	copyResponseHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, p.cfg.MaxBodyBytes))
}
