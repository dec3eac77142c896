package kvindex_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestCollectorExportsTheSubscribersView follows a publishing engine and
// reads the router's KV-event metrics: connected, every batch applied, and
// the next sequence expected equal to the engine's published count (no
// lag once caught up).
func TestCollectorExportsTheSubscribersView(t *testing.T) {
	pub := startPublisher(t)
	idx := kvindex.New(fingerprint, 16, quiet)
	t.Cleanup(idx.Close)
	reg := prometheus.NewRegistry()
	reg.MustRegister(idx.Collector())
	if err := idx.Follow("http://d1:8000", "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String(), ""); err != nil {
		t.Fatal(err)
	}

	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 16, NumBlocks: 64, ExtraKey: fingerprint, Observer: pub})
	if err != nil {
		t.Fatal(err)
	}
	for step := range 3 { // three batches: one per flushed step
		ids, ok := blocks.Allocate(1)
		if !ok {
			t.Fatal("no room")
		}
		blocks.Cache(ids[0], kvcache.BlockHash{byte(1 + step)})
		pub.Flush()
	}
	testutil.WaitFor(t, "the router to apply the engine's 3 batches", 10*time.Second, func() bool {
		v := gather(t, reg)
		return v["tandem:router_kv_events_connected"] == 1 && v["tandem:router_kv_events_next_sequence"] == float64(pub.Stats().Published) && pub.Stats().Published == 3
	})
	v := gather(t, reg)
	if v["tandem:router_kv_events_batches_applied_total"] != 3 {
		t.Errorf("batches applied = %v, want 3", v["tandem:router_kv_events_batches_applied_total"])
	}
	for _, name := range []string{"tandem:router_kv_events_batches_lost_total", "tandem:router_kv_events_gaps_total", "tandem:router_kv_events_restarts_total", "tandem:router_kv_events_malformed_total"} {
		if v[name] != 0 {
			t.Errorf("%s = %v, want 0", name, v[name])
		}
	}
	if _, ok := v["tandem:router_kv_events_replays_total"]; !ok {
		t.Error("no tandem:router_kv_events_replays_total")
	}
}

// gather returns each metric's value for engine http://d1:8000.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if !hasLabel(m, "engine", "http://d1:8000") {
				t.Fatalf("%s has labels %v, want engine=http://d1:8000", mf.GetName(), m.GetLabel())
			}
			if g := m.GetGauge(); g != nil {
				out[mf.GetName()] = g.GetValue()
			} else {
				out[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
