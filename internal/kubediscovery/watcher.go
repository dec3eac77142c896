package kubediscovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Roles of a pool, as the proxy names them.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// DefaultPortName is the EndpointSlice port a pool's engines are reached
// on unless Pool.PortName says otherwise.
const DefaultPortName = "http"

// Backends is what the Watcher feeds: the complete current list of engines
// of a role. *proxy.Proxy implements it.
type Backends interface {
	SetBackends(role string, urls []string) error
}

// Pool says where one role's engines are found.
type Pool struct {
	// Role is "prefill" or "decode".
	Role string
	// Selector is a label selector on EndpointSlices, such as
	// ServiceSelector("tandem-decode") or "app=tandem,role=decode".
	Selector string
	// PortName is the name of the slices' port the engines serve on:
	// empty means "http" (DefaultPortName); UnnamedPort selects the port
	// without a name (a Service with a single unnamed port).
	PortName string
	// Scheme is the engines' URL scheme, "http" (default) or "https".
	Scheme string
}

// UnnamedPort is a Pool.PortName that selects the port without a name.
const UnnamedPort = "-"

// Config configures a Watcher.
type Config struct {
	// Client is the API client; its credentials need list and watch on
	// EndpointSlices (discovery.k8s.io) in Namespace, nothing more.
	Client kubernetes.Interface
	// Namespace holds the slices (default "default").
	Namespace string
	// Pools are the roles to discover, at most one per role.
	Pools []Pool
	// Backends receives each role's ready set: once the role's informer has
	// listed its slices, then on every change of the set (never for an
	// event that leaves the set as it was, nor on a resync or relist that
	// finds nothing new). Until the first list, Backends keeps what it had
	// (a static list serves while the API server cannot be reached).
	Backends Backends
	// Logger receives the Watcher's lines and client-go's (default
	// slog.Default()).
	Logger *slog.Logger
	// Registerer, when set, gets the tandem:proxy_discovery_* metrics (the
	// proxy's registry: Proxy.MetricsRegisterer).
	Registerer prometheus.Registerer
	// OnUpdate, when set, is called after each SetBackends call with what
	// it was given and how long the change took.
	OnUpdate func(Update)
}

// Update is one SetBackends call the Watcher made.
type Update struct {
	Role string
	URLs []string
	// Initial is true for the call after the informer's first list.
	Initial bool
	// Event is when the first informer event behind this change arrived
	// (zero when the change was seen without one, which a race between
	// an event and the store can cause).
	Event time.Time
	// Applied is when SetBackends returned.
	Applied time.Time
	// Latency is Applied - Event (0 when Event is zero).
	Latency time.Duration
	// Err is SetBackends' error; the Watcher retries with backoff.
	Err error
}

// Watcher keeps a proxy's pools equal to the ready endpoints of
// EndpointSlices, through Config.Backends. Make one with New, run it with
// Run.
type Watcher struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	pools   []*poolWatch
	started atomic.Bool
}

// New validates cfg and returns a Watcher; nothing is contacted until Run.
func New(cfg Config) (*Watcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubediscovery: no API client")
	}
	if cfg.Backends == nil {
		return nil, errors.New("kubediscovery: nothing to feed (Config.Backends is nil)")
	}
	if len(cfg.Pools) == 0 {
		return nil, errors.New("kubediscovery: no pool to discover")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	w := &Watcher{cfg: cfg, log: cfg.Logger, metrics: m}
	seen := map[string]bool{}
	for _, p := range cfg.Pools {
		if p.Role != RolePrefill && p.Role != RoleDecode {
			return nil, fmt.Errorf("kubediscovery: role %q: want prefill or decode", p.Role)
		}
		if seen[p.Role] {
			return nil, fmt.Errorf("kubediscovery: role %s is given twice", p.Role)
		}
		seen[p.Role] = true
		if p.Selector == "" {
			return nil, fmt.Errorf("kubediscovery: %s: no label selector (a selector matching everything would take every EndpointSlice of the namespace)", p.Role)
		}
		if _, err := labels.Parse(p.Selector); err != nil {
			return nil, fmt.Errorf("kubediscovery: %s selector %q: %w", p.Role, p.Selector, err)
		}
		switch p.PortName {
		case "":
			p.PortName = DefaultPortName
		case UnnamedPort:
			p.PortName = ""
		}
		switch p.Scheme {
		case "":
			p.Scheme = "http"
		case "http", "https":
		default:
			return nil, fmt.Errorf("kubediscovery: %s scheme %q: want http or https", p.Role, p.Scheme)
		}
		w.pools = append(w.pools, &poolWatch{
			w:      w,
			spec:   p,
			log:    cfg.Logger.With("role", p.Role),
			dirty:  make(chan struct{}, 1),
			slices: map[string][]string{},
			warned: map[string]bool{},
		})
	}
	return w, nil
}

// Run watches until ctx is done, then stops its informers and returns nil.
// An API server that cannot be reached is retried with backoff by the
// informers (logged, and counted in tandem:proxy_discovery_watch_errors_total);
// a dropped watch is resumed or, when its resource version has expired,
// relisted. Run may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if w.started.Swap(true) {
		return errors.New("kubediscovery: Run called twice")
	}
	// client-go logs through the context's logger: send it to ours.
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(w.log.Handler()))
	var factories []informers.SharedInformerFactory
	for _, pw := range w.pools {
		sel := pw.spec.Selector
		f := informers.NewSharedInformerFactoryWithOptions(w.cfg.Client, 0,
			informers.WithNamespace(w.cfg.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
		inf := f.Discovery().V1().EndpointSlices().Informer()
		if err := inf.SetWatchErrorHandlerWithContext(pw.watchError); err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(pw)
		if err != nil {
			return err
		}
		pw.reg = reg
		factories = append(factories, f)
	}
	for _, f := range factories {
		f.StartWithContext(ctx)
	}
	w.log.Info("kubernetes discovery started", "namespace", w.cfg.Namespace, "pools", w.describe())
	var wg sync.WaitGroup
	for _, pw := range w.pools {
		wg.Go(func() { pw.run(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	for _, f := range factories {
		f.Shutdown()
	}
	return nil
}

func (w *Watcher) describe() []string {
	var out []string
	for _, pw := range w.pools {
		port := pw.spec.PortName
		if port == "" {
			port = "(unnamed)"
		}
		out = append(out, fmt.Sprintf("%s: %s port %s", pw.spec.Role, pw.spec.Selector, port))
	}
	return out
}

// Synced reports whether every pool's informer has listed its slices and
// the first set has been handed to Backends.
func (w *Watcher) Synced() bool {
	for _, pw := range w.pools {
		if !pw.synced.Load() {
			return false
		}
	}
	return true
}

// Applied returns the set last handed to Backends for role, and false
// before the first.
func (w *Watcher) Applied(role string) ([]string, bool) {
	for _, pw := range w.pools {
		if pw.spec.Role == role {
			pw.mu.Lock()
			defer pw.mu.Unlock()
			return slices.Clone(pw.applied), pw.haveApplied
		}
	}
	return nil, false
}

// poolWatch is one role's informer handler and the worker that applies its
// changes. The handler keeps each slice's ready URLs; the worker hands
// their union to Backends when it differs from the last one handed.
type poolWatch struct {
	w     *Watcher
	spec  Pool
	log   *slog.Logger
	reg   cache.ResourceEventHandlerRegistration
	dirty chan struct{} // one pending signal coalesces a burst of events

	mu          sync.Mutex
	slices      map[string][]string // slice key -> its ready URLs
	warned      map[string]bool     // slices already logged as lacking the port
	pending     time.Time           // first event not yet applied
	applied     []string
	haveApplied bool
	emptyLogged bool

	synced atomic.Bool
}

// OnAdd implements cache.ResourceEventHandler.
func (pw *poolWatch) OnAdd(obj any, _ bool) { pw.event("add", obj) }

// OnUpdate implements cache.ResourceEventHandler.
func (pw *poolWatch) OnUpdate(_, obj any) { pw.event("update", obj) }

// OnDelete implements cache.ResourceEventHandler.
func (pw *poolWatch) OnDelete(obj any) {
	now := time.Now()
	pw.w.metrics.events.WithLabelValues(pw.spec.Role, "delete").Inc()
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	pw.mu.Lock()
	_, had := pw.slices[key]
	delete(pw.slices, key)
	delete(pw.warned, key)
	pw.mark(now, had)
	pw.mu.Unlock()
}

func (pw *poolWatch) event(kind string, obj any) {
	now := time.Now()
	pw.w.metrics.events.WithLabelValues(pw.spec.Role, kind).Inc()
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(s)
	if err != nil {
		return
	}
	urls := EndpointURLs(s, pw.spec.PortName, pw.spec.Scheme)
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if _, has := PortOf(s, pw.spec.PortName); !has && len(s.Endpoints) > 0 && !pw.warned[key] {
		pw.warned[key] = true
		pw.log.Warn("EndpointSlice has no TCP port of the pool's port name; its endpoints are not used",
			"slice", key, "port_name", pw.spec.PortName, "ports", portNames(s))
	}
	old, had := pw.slices[key]
	pw.slices[key] = urls
	pw.mark(now, !had || !slices.Equal(old, urls))
}

// mark records, under mu, that the slices changed at now, and wakes the
// worker.
func (pw *poolWatch) mark(now time.Time, changed bool) {
	if !changed {
		return
	}
	if pw.pending.IsZero() {
		pw.pending = now
	}
	select {
	case pw.dirty <- struct{}{}:
	default:
	}
}

func portNames(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, p := range s.Ports {
		name := "(unnamed)"
		if p.Name != nil && *p.Name != "" {
			name = *p.Name
		}
		out = append(out, name)
	}
	return out
}

// watchError is the informer's watch error handler: the reflector backs
// off and retries after it returns.
func (pw *poolWatch) watchError(_ context.Context, _ *cache.Reflector, err error) {
	switch {
	case errors.Is(err, io.EOF):
		return // a watch closed normally
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.ErrUnexpectedEOF):
		// The reflector relists; nothing is lost.
		pw.log.Debug("EndpointSlice watch closed; relisting", "err", err)
		return
	}
	pw.w.metrics.watchErrors.WithLabelValues(pw.spec.Role).Inc()
	if pw.synced.Load() {
		pw.log.Warn("EndpointSlice watch failed; retrying with backoff, the last known backends keep serving", "err", err)
	} else {
		pw.log.Warn("cannot list EndpointSlices; retrying with backoff, the static backends (if any) keep serving", "err", err)
	}
}

// Retry bounds for a SetBackends that failed.
const (
	retryBase = 500 * time.Millisecond
	retryMax  = 30 * time.Second
)

// run waits for the informer's first list, hands the first set to
// Backends, then applies every change until ctx is done.
func (pw *poolWatch) run(ctx context.Context) {
	begin := time.Now()
	select {
	case <-pw.reg.HasSyncedChecker().Done():
	case <-ctx.Done():
		return
	}
	pw.log.Info("EndpointSlices listed", "selector", pw.spec.Selector, "namespace", pw.w.cfg.Namespace, "took", time.Since(begin))
	retry := time.NewTimer(0)
	<-retry.C
	delay := retryBase
	initial := true
	for {
		if err := pw.apply(initial); err != nil {
			retry.Reset(delay)
			delay = min(2*delay, retryMax)
		} else {
			if initial {
				pw.synced.Store(true)
				pw.w.metrics.synced.WithLabelValues(pw.spec.Role).Set(1)
			}
			initial = false
			delay = retryBase
		}
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-pw.dirty:
		case <-retry.C:
		}
	}
}

// apply hands the current set to Backends if it differs from the last one
// handed (always on the initial call).
func (pw *poolWatch) apply(initial bool) error {
	pw.mu.Lock()
	urls := union(pw.slices)
	ev := pw.pending
	pw.pending = time.Time{}
	same := pw.haveApplied && slices.Equal(urls, pw.applied)
	prev := pw.applied
	pw.mu.Unlock()
	if same && !initial {
		return nil
	}
	err := pw.w.cfg.Backends.SetBackends(pw.spec.Role, urls)
	done := time.Now()
	u := Update{Role: pw.spec.Role, URLs: urls, Initial: initial, Event: ev, Applied: done, Err: err}
	if !ev.IsZero() {
		u.Latency = done.Sub(ev)
	}
	role := pw.spec.Role
	if err != nil {
		pw.w.metrics.updates.WithLabelValues(role, "error").Inc()
		pw.log.Error("the proxy refused the discovered backends; retrying", "backends", urls, "err", err)
		pw.mu.Lock()
		if pw.pending.IsZero() {
			pw.pending = ev
		}
		pw.mu.Unlock()
	} else {
		pw.w.metrics.updates.WithLabelValues(role, "ok").Inc()
		pw.w.metrics.backends.WithLabelValues(role).Set(float64(len(urls)))
		if !initial && !ev.IsZero() {
			pw.w.metrics.seconds.WithLabelValues(role).Observe(u.Latency.Seconds())
		}
		added, removed := diff(prev, urls)
		if initial {
			pw.log.Info("discovered backends applied (initial list)", "backends", len(urls), "added", added)
		} else {
			pw.log.Info("discovered backends applied", "backends", len(urls), "added", added, "removed", removed, "latency", u.Latency)
		}
		pw.mu.Lock()
		pw.applied, pw.haveApplied = urls, true
		logEmpty := len(urls) == 0 && !pw.emptyLogged
		pw.emptyLogged = len(urls) == 0
		pw.mu.Unlock()
		if logEmpty {
			pw.log.Warn("no ready endpoint matches the pool's selector: the pool is empty until one does",
				"selector", pw.spec.Selector, "namespace", pw.w.cfg.Namespace, "port_name", pw.spec.PortName)
		}
	}
	if pw.w.cfg.OnUpdate != nil {
		pw.w.cfg.OnUpdate(u)
	}
	return err
}

// diff returns what is in b and not a, and what is in a and not b; both
// are sorted.
func diff(a, b []string) (added, removed []string) {
	for _, u := range b {
		if _, found := slices.BinarySearch(a, u); !found {
			added = append(added, u)
		}
	}
	for _, u := range a {
		if _, found := slices.BinarySearch(b, u); !found {
			removed = append(removed, u)
		}
	}
	return added, removed
}
