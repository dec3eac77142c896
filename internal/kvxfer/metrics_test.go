package kvxfer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/tandem-serve/tandem/internal/metrics"
)

func TestMetrics(t *testing.T) {
	m := metrics.NewEngine("tiny")
	r := newRig(t, rigOpts{
		transport: TransportTCP,
		prodMut:   func(pc *ProducerConfig) { pc.Metrics = m },
		consMut:   func(cc *ConsumerConfig) { cc.Metrics = m },
	})
	r.hold(t, "a", 1, 2)
	r.hold(t, "b", 3)
	if got := value(t, m.KVBlocksHeld); got != 3 {
		t.Fatalf("kv_blocks_held = %v after holding 3 blocks", got)
	}
	if err := r.cons.Pull(ctxT(t), r.params("a", 1, 2), newLocalBlocks(2, tiny.BlockBytes)); err != nil {
		t.Fatal(err)
	}
	if got := value(t, m.KVTransferBytes); got != float64(2*tiny.BlockBytes) {
		t.Fatalf("kv_transfer_bytes_total = %v, want %d", got, 2*tiny.BlockBytes)
	}
	var h dto.Metric
	m.KVTransferSeconds.(prometheus.Metric).Write(&h)
	if got := h.GetHistogram().GetSampleCount(); got != 1 {
		t.Fatalf("kv_transfer_seconds has %d samples, want 1", got)
	}
	if got := value(t, m.KVBlocksHeld); got != 1 {
		t.Fatalf("kv_blocks_held = %v after DONE for 2 of 3 blocks", got)
	}
	r.prod.Sweep(time.Now().Add(time.Hour))
	if got := value(t, m.KVLeasesExpired); got != 1 {
		t.Fatalf("kv_leases_expired_total = %v", got)
	}
	if got := value(t, m.KVBlocksHeld); got != 0 {
		t.Fatalf("kv_blocks_held = %v after expiry", got)
	}
	r.cons.Pull(ctxT(t), r.params("b", 3), newLocalBlocks(1, tiny.BlockBytes))
	if got := value(t, m.KVTransferFailures.WithLabelValues("not_held")); got != 1 {
		t.Fatalf("kv_transfer_failures_total{reason=not_held} = %v", got)
	}
}

// value reads a gauge or counter.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	if g := d.GetGauge(); g != nil {
		return g.GetValue()
	}
	return d.GetCounter().GetValue()
}
