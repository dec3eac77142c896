package kvindex

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandem-serve/tandem/internal/kvevents"
)

// subscriberCollector exports what the router's KV-event subscriber saw of
// each decode it follows, labelled engine (the decode's backend URL).
type subscriberCollector struct {
	p                                                             *Precise
	connected, next                                               *prometheus.Desc
	applied, duplicates, gaps, replays, lost, restarts, malformed *prometheus.Desc
}

// Collector returns the Prometheus collector of the subscriber's state per
// followed decode: tandem:router_kv_events_connected, the next sequence
// number expected (tandem:router_kv_events_next_sequence, to set against
// the engine's tandem:kv_events_batches_published_total), and counters of
// batches applied, duplicates, sequence gaps, replays, batches lost for
// good, engine restarts and undecodable batches. Register it on the proxy's
// /metrics registry.
func (p *Precise) Collector() prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"engine"}, nil)
	}
	return &subscriberCollector{
		p:          p,
		connected:  d("tandem:router_kv_events_connected", "1 while the router follows the decode's live KV events (after the replay that starts each connection), else 0."),
		next:       d("tandem:router_kv_events_next_sequence", "The next KV event batch sequence number the router expects from the decode; the decode's tandem:kv_events_batches_published_total less this is how far behind the router is."),
		applied:    d("tandem:router_kv_events_batches_applied_total", "KV event batches the router applied to its prefix index."),
		duplicates: d("tandem:router_kv_events_duplicates_total", "KV event batches received again (replay and live messages overlapping) and skipped."),
		gaps:       d("tandem:router_kv_events_gaps_total", "Sequence gaps in the decode's live KV events (batches the router missed; each starts a replay)."),
		replays:    d("tandem:router_kv_events_replays_total", "Replay requests the router made to the decode."),
		lost:       d("tandem:router_kv_events_batches_lost_total", "KV event batches neither received nor replayable: the router cleared the decode's entries and starts over."),
		restarts:   d("tandem:router_kv_events_restarts_total", "Restarts of the decode the router detected (its entries cleared)."),
		malformed:  d("tandem:router_kv_events_malformed_total", "KV event batches the router could not decode (skipped)."),
	}
}

// Describe implements prometheus.Collector.
func (c *subscriberCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.connected, c.next, c.applied, c.duplicates, c.gaps, c.replays, c.lost, c.restarts, c.malformed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *subscriberCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.sub.AllStats(func(engine string, st kvevents.EngineStats) {
		connected := 0.0
		if st.Connected {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, connected, engine)
		ch <- prometheus.MustNewConstMetric(c.next, prometheus.GaugeValue, float64(st.Next), engine)
		for _, x := range []struct {
			d *prometheus.Desc
			v uint64
		}{{c.applied, st.Applied}, {c.duplicates, st.Duplicates}, {c.gaps, st.Gaps}, {c.replays, st.Replays}, {c.lost, st.Lost}, {c.restarts, st.Restarts}, {c.malformed, st.Malformed}} {
			ch <- prometheus.MustNewConstMetric(x.d, prometheus.CounterValue, float64(x.v), engine)
		}
	})
}
