package kubediscovery

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Watcher's collectors, registered on Config.Registerer
// (the proxy's registry, so they appear on its /metrics).
type metrics struct {
	backends    *prometheus.GaugeVec
	synced      *prometheus.GaugeVec
	updates     *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	events      *prometheus.CounterVec
	watchErrors *prometheus.CounterVec
}

// latencyBuckets span a local apply (sub-millisecond) to a slow health
// check of new engines inside SetBackends (seconds).
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		backends: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tandem:proxy_discovery_backends",
			Help: "Ready endpoints that Kubernetes discovery last gave the pool, by role.",
		}, []string{"role"}),
		synced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tandem:proxy_discovery_synced",
			Help: "1 once the pool's EndpointSlice informer has listed its slices (before, the static backends, if any, serve).",
		}, []string{"role"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_discovery_updates_total",
			Help: "Changes of a pool's ready endpoints handed to the proxy, by role and result (ok, error).",
		}, []string{"role", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tandem:proxy_discovery_update_seconds",
			Help:    "Time from the EndpointSlice informer event to the proxy's pool holding the new set (SetBackends returned, new engines health-checked), by role; the initial list is not counted.",
			Buckets: latencyBuckets,
		}, []string{"role"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_discovery_events_total",
			Help: "EndpointSlice informer events, by role and type (add, update, delete); most change nothing the proxy uses.",
		}, []string{"role", "type"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:proxy_discovery_watch_errors_total",
			Help: "Failed lists and dropped watches of EndpointSlices, by role; the informer retries with backoff and relists.",
		}, []string{"role"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.backends, m.synced, m.updates, m.seconds, m.events, m.watchErrors} {
		if err := reg.Register(c); err != nil {
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, errors.New("kubediscovery: the registry already has discovery metrics: one Watcher per registry")
			}
			return nil, err
		}
	}
	return m, nil
}
