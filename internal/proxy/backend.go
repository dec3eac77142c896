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
	"github.com/tandem-serve/tandem/internal/proxy/picker"
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
	index    int
	healthy  atomic.Bool
	inFlight atomic.Int64
	inGauge  prometheus.Gauge
	okGauge  prometheus.Gauge

	mu        sync.Mutex
	lastErr   string
	lastCheck time.Time
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

// acquire counts a request as open on b; the returned func closes it.
func (b *backend) acquire() (release func()) {
	b.inFlight.Add(1)
	b.inGauge.Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.inFlight.Add(-1)
			b.inGauge.Dec()
		})
	}
}

// pool is the backends of one role and the policy that picks among them.
type pool struct {
	role     string
	backends []*backend
	picker   picker.Picker
}

func newPool(role string, urls []string, p picker.Picker, m *metrics) (*pool, error) {
	if len(urls) == 0 {
		return nil, fmt.Errorf("no %s backends: give at least one URL with --%s", role, role)
	}
	pl := &pool{role: role, picker: p}
	seen := map[string]bool{}
	for i, raw := range urls {
		base, err := normalizeURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%s backend %q: %w", role, raw, err)
		}
		if seen[base] {
			return nil, fmt.Errorf("%s backend %s is listed twice", role, base)
		}
		seen[base] = true
		pl.backends = append(pl.backends, &backend{
			role:    role,
			base:    base,
			index:   i,
			inGauge: m.inFlight.WithLabelValues(role, base),
			okGauge: m.healthy.WithLabelValues(role, base),
		})
	}
	return pl, nil
}

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
	for _, b := range pl.backends {
		if b.healthy.Load() {
			return true
		}
	}
	return false
}

// pick offers the healthy backends to the policy and returns its choice, or
// nil when none is healthy.
func (pl *pool) pick(req *picker.Request) *backend {
	eps := make([]picker.Endpoint, 0, len(pl.backends))
	for _, b := range pl.backends {
		if b.healthy.Load() {
			eps = append(eps, picker.Endpoint{Index: b.index, URL: b.base, InFlight: b.inFlight.Load()})
		}
	}
	if len(eps) == 0 {
		return nil
	}
	i := pl.picker.Pick(req, eps)
	if i < 0 || i >= len(eps) {
		i = 0
	}
	return pl.backends[eps[i].Index]
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
	out := make([]backendState, 0, len(pl.backends))
	for _, b := range pl.backends {
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
	ok := errText == ""
	if b.setHealth(ok, errText, time.Now()) {
		if ok {
			log.Info("backend healthy", "role", b.role, "backend", b.base)
		} else {
			log.Warn("backend unhealthy", "role", b.role, "backend", b.base, "err", errText)
		}
	}
}

// markDown records a failed request to b so that it is skipped until the
// next health check passes.
func markDown(b *backend, err error, log *slog.Logger) {
	if b.setHealth(false, err.Error(), time.Now()) {
		log.Warn("backend unhealthy", "role", b.role, "backend", b.base, "err", err)
	}
}
