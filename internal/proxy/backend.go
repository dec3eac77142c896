package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tandem-serve/tandem/internal/router"
)

// Roles of a backend pool.
const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// backend is one engine the proxy talks to. Health starts false: a backend
// is used only after a health check has passed, so the proxy never reports
// ready while an engine is still loading its model.
type backend struct {
	role     string
	base     string // base URL without a trailing slash
	host     string // for same-host preference
	index    int
	healthy  atomic.Bool
	inFlight atomic.Int64
	inTokens atomic.Int64 // prompt + expected output tokens of the requests in flight
	// inLocal is the uncached prompt tokens of the local prefills sent to
	// the engine and not yet answered (their first byte).
	inLocal atomic.Int64
	// holds counts the requests whose KV this (prefill) backend holds for
	// a decode: from its prefill leg's answer until the request ends or
	// the release reached the engine. The planner drains it before the
	// engine changes role.
	holds   atomic.Int64
	inGauge prometheus.Gauge
	okGauge prometheus.Gauge

	mu        sync.Mutex
	lastErr   string
	lastCheck time.Time
	// Circuit breaker: consecutive failed legs, ejections in a row, and
	// the time before which health checks do not re-admit the engine.
	fails        int
	ejections    int
	ejectedUntil time.Time
	// restarted is set when whoever runs the engine said its process was
	// replaced (BackendsChanged); the next passing health check then
	// clears the breaker, whose record is of the old process.
	restarted bool
	// The engine's load as last scraped from its /metrics.
	waiting, running, kvUsage float64
	scrapedAt                 time.Time
	// inFlightAtScrape is inFlight when that scrape's answer arrived:
	// endpoint reports the change since (router.Endpoint.SinceScrape).
	inFlightAtScrape int64
	// costs are the engine's measured costs, from the same scrapes.
	costs costs
	// legs are every engine's costs measured from the proxy's legs (the
	// pools' legBook; nil for a backend made outside a pool).
	legs *legBook
}

// setHealth records a check's result and reports whether the state changed.
func (b *backend) setHealth(ok bool, errText string, now time.Time) (changed bool) {
	b.mu.Lock()
	b.lastErr = errText
	b.lastCheck = now
	b.mu.Unlock()
	if ok {
		b.okGauge.Set(1)
	} else {
		b.okGauge.Set(0)
	}
	return b.healthy.Swap(ok) != ok
}

// acquire counts a request of tokens tokens as open on b; the returned func
// closes it.
func (b *backend) acquire(tokens int64) (release func()) {
	b.inFlight.Add(1)
	b.inTokens.Add(tokens)
	b.inGauge.Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.inFlight.Add(-1)
			b.inTokens.Add(-tokens)
			b.inGauge.Dec()
		})
	}
}

// pool is the backends of one role and the pipeline that picks among them.
type pool struct {
	role    string
	set     atomic.Pointer[[]*backend] // copy on write: backends change at run time
	setMu   sync.Mutex                 // serialises changes of set
	nextIdx int                        // under setMu: the next backend's index
	metrics *metrics
	profile *router.Profile
	// pickMu makes a pick and the accounting of its request one step, so
	// that the next pick, even in the same microsecond, sees it.
	pickMu sync.Mutex
	// stale is the age beyond which scraped metrics are ignored (0: always
	// ignored).
	stale time.Duration
	// prefix, when set, fills each endpoint's prefix hit before scoring.
	prefix func(req *router.Request) map[string]int
	// legs are the engines' leg-measured costs (every pool's: shared).
	legs *legBook
}

func newPool(role string, urls []string, prof *router.Profile, m *metrics, legs *legBook, allowEmpty bool) (*pool, error) {
	if len(urls) == 0 && !allowEmpty {
		return nil, fmt.Errorf("no %s backends: give at least one URL with --%s", role, role)
	}
	pl := &pool{role: role, profile: prof, metrics: m, legs: legs}
	pl.set.Store(&[]*backend{})
	if _, _, err := pl.update(urls); err != nil {
		return nil, err
	}
	return pl, nil
}

// list returns the pool's backends now. The slice must not be modified.
func (pl *pool) list() []*backend { return *pl.set.Load() }

// update makes urls the pool's backends: backends already present keep
// their state (health, accounting), new ones start unhealthy until a health
// check passes, removed ones get no new requests (those in flight finish:
// nothing cancels them).
func (pl *pool) update(urls []string) (added, removed []*backend, err error) {
	want := make([]string, 0, len(urls))
	seen := map[string]bool{}
	for _, raw := range urls {
		base, err := normalizeURL(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%s backend %q: %w", pl.role, raw, err)
		}
		if seen[base] {
			return nil, nil, fmt.Errorf("%s backend %s is listed twice", pl.role, base)
		}
		seen[base] = true
		want = append(want, base)
	}
	pl.setMu.Lock()
	defer pl.setMu.Unlock()
	old := map[string]*backend{}
	for _, b := range pl.list() {
		old[b.base] = b
	}
	next := make([]*backend, 0, len(want))
	for _, base := range want {
		if b := old[base]; b != nil {
			next = append(next, b)
			delete(old, base)
			continue
		}
		u, _ := url.Parse(base)
		b := &backend{
			role:    pl.role,
			base:    base,
			host:    u.Hostname(),
			index:   pl.nextIdx,
			legs:    pl.legs,
			inGauge: pl.metrics.inFlight.WithLabelValues(pl.role, base),
			okGauge: pl.metrics.healthy.WithLabelValues(pl.role, base),
		}
		pl.nextIdx++
		next = append(next, b)
		added = append(added, b)
	}
	pl.set.Store(&next)
	for _, b := range old {
		// Requests in flight on b keep their *backend and finish; b is
		// marked unhealthy so that nothing holding it (a conversation's
		// decode affinity) sends it new work, since no health check will
		// run on it again.
		b.setHealth(false, "removed from the backend set", time.Now())
		removed = append(removed, b)
		pl.metrics.inFlight.DeleteLabelValues(pl.role, b.base)
		pl.metrics.healthy.DeleteLabelValues(pl.role, b.base)
	}
	return added, removed, nil
}

// NormalizeBackendURL returns a backend URL as the proxy names the backend
// (in metrics, /health and a precise prefix index): "host:port" gets
// http://, a trailing slash goes.
func NormalizeBackendURL(raw string) (string, error) { return normalizeURL(raw) }

// normalizeURL accepts "http://host:port[/prefix]" or "host:port" and returns
// the base URL without a trailing slash.
func normalizeURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("no host: want e.g. http://127.0.0.1:8100")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("a backend URL takes no query or fragment")
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// anyHealthy reports whether at least one backend is healthy.
func (pl *pool) anyHealthy() bool {
	for _, b := range pl.list() {
		if b.healthy.Load() {
			return true
		}
	}
	return false
}

// pick runs the pool's pipeline over a snapshot of its backends, skipping
// those in exclude, and counts the request (tokens) on the chosen one before
// any other pick can run. It returns nil when no backend is a candidate;
// saturated then says whether some were healthy but all saturated (the
// caller queues) rather than none healthy.
func (pl *pool) pick(req *router.Request, tokens int64, exclude ...*backend) (b *backend, release func(), saturated bool) {
	var hits map[string]int
	if pl.prefix != nil && len(req.BlockHashes) > 0 {
		hits = pl.prefix(req)
	}
	sc := pickScratch.Get().(*pickBufs)
	defer pickScratch.Put(sc)
	pl.pickMu.Lock()
	defer pl.pickMu.Unlock()
	bs, eps := pl.snapshot(sc, hits, exclude)
	defer sc.keep(bs, eps)
	if len(eps) == 0 {
		return nil, nil, false
	}
	i, err := pl.profile.Run(req, eps)
	if err != nil {
		for _, e := range eps {
			if e.Healthy {
				return nil, nil, true
			}
		}
		return nil, nil, false
	}
	b = bs[i]
	return b, b.acquire(tokens), false
}

// pickBufs is a pick's snapshot memory, reused across picks.
type pickBufs struct {
	bs  []*backend
	eps []router.Endpoint
}

var pickScratch = sync.Pool{New: func() any { return new(pickBufs) }}

// keep stores the (possibly grown) buffers back, emptied: no backend stays
// reachable from the pool.
func (sc *pickBufs) keep(bs []*backend, eps []router.Endpoint) {
	clear(bs)
	sc.bs, sc.eps = bs[:0], eps[:0]
}

// snapshot returns the endpoints the pipeline sees and their backends, in
// sc's memory.
func (pl *pool) snapshot(sc *pickBufs, hits map[string]int, exclude []*backend) ([]*backend, []router.Endpoint) {
	all := pl.list()
	bs, eps := sc.bs[:0], sc.eps[:0]
	now := time.Now()
outer:
	for _, b := range all {
		for _, x := range exclude {
			if x == b {
				continue outer
			}
		}
		bs = append(bs, b)
		eps = append(eps, b.endpoint(now, pl.stale, hits[b.base]))
	}
	return bs, eps
}

func (b *backend) endpoint(now time.Time, stale time.Duration, prefixBlocks int) router.Endpoint {
	e := router.Endpoint{
		Index: b.index, URL: b.base, Host: b.host, Role: b.role,
		Healthy: b.healthy.Load(), InFlight: b.inFlight.Load(), InFlightTokens: b.inTokens.Load(),
		LocalPrefillTokens: b.inLocal.Load(), PrefixBlocks: prefixBlocks,
	}
	b.mu.Lock()
	if !b.scrapedAt.IsZero() && now.Sub(b.scrapedAt) <= stale {
		e.Scraped, e.Waiting, e.Running, e.KVUsage = true, b.waiting, b.running, b.kvUsage
		e.SinceScrape = e.InFlight - b.inFlightAtScrape
		e.PrefillSecondsPerToken, e.TransferSecondsPerToken, e.QueueSeconds = b.costs.prefillPerToken, b.costs.transferPerToken, b.costs.queue
		e.ITLSeconds = b.costs.itl
	}
	b.mu.Unlock()
	b.legs.fill(&e, b.base)
	return e
}

// backendState is one backend in the /health body.
type backendState struct {
	URL       string `json:"url"`
	Healthy   bool   `json:"healthy"`
	InFlight  int64  `json:"in_flight"`
	LastError string `json:"last_error,omitempty"`
	LastCheck string `json:"last_check,omitempty"`
}

func (pl *pool) states() []backendState {
	out := make([]backendState, 0, len(pl.list()))
	for _, b := range pl.list() {
		b.mu.Lock()
		s := backendState{URL: b.base, Healthy: b.healthy.Load(), InFlight: b.inFlight.Load(), LastError: b.lastErr}
		if !b.lastCheck.IsZero() {
			s.LastCheck = b.lastCheck.UTC().Format(time.RFC3339Nano)
		}
		b.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// checkBackend GETs b's /health with a timeout; 200 means healthy.
// The backend key goes along in case a backend protects /health too (Tandem
// and vLLM engines leave it open).
func checkBackend(parent context.Context, client *http.Client, b *backend, timeout time.Duration, key string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	errText := ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/health", nil)
	if err == nil {
		setAuth(req.Header, key)
		var resp *http.Response
		resp, err = client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errText = fmt.Sprintf("/health answered %s", resp.Status)
			}
		}
	}
	if err != nil {
		errText = err.Error()
	}
	if parent.Err() != nil {
		return // the proxy is shutting down; keep the last known state
	}
	now := time.Now()
	if errText == "" {
		b.mu.Lock()
		if b.restarted {
			b.restarted = false
			if b.fails > 0 || b.ejections > 0 {
				log.Info("circuit breaker reset: the backend's process was restarted", "role", b.role, "backend", b.base)
			}
			b.fails, b.ejections, b.ejectedUntil = 0, 0, time.Time{}
		}
		if now.Before(b.ejectedUntil) {
			errText = fmt.Sprintf("ejected by the circuit breaker until %s after %d failed requests in a row", b.ejectedUntil.UTC().Format(time.RFC3339Nano), breakerThreshold)
		}
		b.mu.Unlock()
	}
	ok := errText == ""
	if b.setHealth(ok, errText, now) {
		if ok {
			log.Info("backend healthy", "role", b.role, "backend", b.base)
		} else {
			log.Warn("backend unhealthy", "role", b.role, "backend", b.base, "err", errText)
		}
	}
}

// BackendsChanged checks every backend once, as CheckHealth does, after
// an engine exited or came back. restarted is the URL of a backend whose
// engine process was replaced and is healthy again ("" when none): its
// circuit breaker counted the failures of the old process, so a passing
// health check of the new one re-admits it at once and forgets them,
// rather than keeping it ejected until the cool-down ends. `tandem up`'s
// supervisor calls it.
func (p *Proxy) BackendsChanged(ctx context.Context, restarted string) {
	if restarted != "" {
		if u, err := normalizeURL(restarted); err == nil {
			for _, pl := range []*pool{p.prefill, p.decode} {
				for _, b := range pl.list() {
					if b.base == u {
						b.mu.Lock()
						b.restarted = true
						b.mu.Unlock()
					}
				}
			}
		}
	}
	p.CheckHealth(ctx)
}

// markDown records a failed request to b so that it is skipped until the
// next health check passes.
func markDown(b *backend, err error, log *slog.Logger) {
	if b.setHealth(false, err.Error(), time.Now()) {
		log.Warn("backend unhealthy", "role", b.role, "backend", b.base, "err", err)
	}
}

// Circuit breaker: breakerThreshold failed legs in a row (5xx answers, bad
// answers, unreachable) eject an engine that still passes its health checks
// (an engine answering /health but failing requests) for breakerBase,
// doubling with each ejection in a row up to breakerMax.
const (
	breakerThreshold = 3
	breakerBase      = time.Second
	breakerMax       = 30 * time.Second
)

// legFailed counts a failed leg on b and ejects it at the threshold.
func legFailed(b *backend, why string, log *slog.Logger) {
	b.mu.Lock()
	b.fails++
	eject := b.fails >= breakerThreshold
	var until time.Time
	if eject {
		b.fails = 0
		b.ejections++
		d := min(breakerBase<<min(b.ejections-1, 8), breakerMax)
		until = time.Now().Add(d)
		b.ejectedUntil = until
	}
	b.mu.Unlock()
	if eject {
		b.setHealth(false, "circuit breaker: "+why, time.Now())
		log.Warn("backend ejected by the circuit breaker", "role", b.role, "backend", b.base, "until", until, "err", why)
	}
}

// legOK resets b's failure count after a successful leg.
func legOK(b *backend) {
	b.mu.Lock()
	b.fails = 0
	if time.Now().After(b.ejectedUntil) {
		b.ejections = 0
	}
	b.mu.Unlock()
}
