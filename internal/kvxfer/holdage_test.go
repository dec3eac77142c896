package kvxfer

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tandem-serve/tandem/internal/metrics"
	tutil "github.com/tandem-serve/tandem/internal/testutil"
)

// TestHoldsByAge checks tandem:kv_holds_by_age and
// tandem:kv_hold_oldest_seconds against the lease table: a decode leg's
// hold and a conversation's, each counted under every bound its age
// passed, and gone from the counts once released.
func TestHoldsByAge(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clk := tutil.NewFakeClock(start)
	m := metrics.NewEngine("tiny")
	r := newRig(t, rigOpts{
		transport: TransportTCP,
		prodMut:   func(pc *ProducerConfig) { pc.Metrics = m; pc.Clock = clk; pc.Lease = time.Hour },
	})
	if err := r.prod.Hold("leg", []int{1, 2}, start); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50 * time.Second)
	if err := r.prod.HoldFor("conv", []int{3}, clk.Now(), time.Hour, true); err != nil {
		t.Fatal(err)
	}
	clk.Advance(20 * time.Second) // leg: 70 s old, conv: 20 s

	want := `
# HELP tandem:kv_hold_oldest_seconds Age of the oldest KV hold kept for another engine, by kind (0 when none).
# TYPE tandem:kv_hold_oldest_seconds gauge
tandem:kv_hold_oldest_seconds{kind="conversation",model_name="tiny"} 20
tandem:kv_hold_oldest_seconds{kind="decode_leg",model_name="tiny"} 70
# HELP tandem:kv_holds_by_age KV holds kept for another engine, by kind (decode_leg: a prefill's hold for the decode that pulls it; conversation: a decode's hold for the next turn), that are older than older_than.
# TYPE tandem:kv_holds_by_age gauge
tandem:kv_holds_by_age{kind="conversation",model_name="tiny",older_than="0s"} 1
tandem:kv_holds_by_age{kind="conversation",model_name="tiny",older_than="10s"} 1
tandem:kv_holds_by_age{kind="conversation",model_name="tiny",older_than="1800s"} 0
tandem:kv_holds_by_age{kind="conversation",model_name="tiny",older_than="300s"} 0
tandem:kv_holds_by_age{kind="conversation",model_name="tiny",older_than="60s"} 0
tandem:kv_holds_by_age{kind="decode_leg",model_name="tiny",older_than="0s"} 1
tandem:kv_holds_by_age{kind="decode_leg",model_name="tiny",older_than="10s"} 1
tandem:kv_holds_by_age{kind="decode_leg",model_name="tiny",older_than="1800s"} 0
tandem:kv_holds_by_age{kind="decode_leg",model_name="tiny",older_than="300s"} 0
tandem:kv_holds_by_age{kind="decode_leg",model_name="tiny",older_than="60s"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "tandem:kv_holds_by_age", "tandem:kv_hold_oldest_seconds"); err != nil {
		t.Fatal(err)
	}

	// A decode leg that never pulls (its lease kept alive) climbs into
	// the 300 s bound.
	clk.Advance(5 * time.Minute)
	r.prod.Sweep(clk.Now())
	if got := holdCount(t, m, "decode_leg", "300s"); got != 1 {
		t.Errorf("holds older than 300s after 370 s = %v, want 1", got)
	}

	if err := r.prod.Release("leg"); err != nil {
		t.Fatal(err)
	}
	r.prod.TakeReleased()
	if got := holdCount(t, m, "decode_leg", "0s"); got != 0 {
		t.Errorf("decode-leg holds after the release = %v, want 0", got)
	}
}

// holdCount reads tandem:kv_holds_by_age{kind,older_than} from m.
func holdCount(t *testing.T, m *metrics.Engine, kind, olderThan string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tandem:kv_holds_by_age" {
			continue
		}
		for _, s := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["kind"] == kind && l["older_than"] == olderThan {
				return s.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no tandem:kv_holds_by_age{kind=%q,older_than=%q}", kind, olderThan)
	return 0
}
