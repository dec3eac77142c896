package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/httpguard"
	"github.com/tandem-serve/tandem/internal/httpleg"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/filter/saturated"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
)

// The Proxy and its construction: New builds the pools' picking pipelines,
// the decider and the routes from a Config (config.go), and the transport
// every backend call shares; ServeHTTP is the front door. Running it is
// serve.go's, its /health and /v1/models endpoints.go's.

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
	// startedColocated says the proxy was started with no prefill engine
	// (Config.Prefill): every decode prefills its own prompts.
	startedColocated bool
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
	// No prefill engine listed, with static pools, is the colocated split
	// where the decider can keep every prompt local.
	colocated := len(cfg.Prefill) == 0 && !dynamic && keepsLocalWithoutPrefill(cfg.PDDecider)
	pre, err := newPool(rolePrefill, cfg.Prefill, pp, m, legs, dynamic || colocated)
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
	p.startedColocated = colocated
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
