package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HoldAgeBounds are the older_than label values of tandem:kv_holds_by_age,
// in seconds: 0 counts every hold.
var HoldAgeBounds = []time.Duration{0, 10 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute}

// Hold kinds, the kind label of tandem:kv_holds_by_age.
const (
	// HoldDecodeLeg is a prefill's hold for a decode leg that will pull it
	// (extended by the decode's heartbeats while it waits).
	HoldDecodeLeg = "decode_leg"
	// HoldConversation is a decode's hold of a conversation's KV for the
	// next turn (a fixed time to live).
	HoldConversation = "conversation"
)

// HoldAges exports the KV holds a producer keeps, by age, read from its
// lease table at scrape time: tandem:kv_holds_by_age{kind,older_than} is
// how many holds are older than each bound of HoldAgeBounds (older_than="0s"
// is all of them), and tandem:kv_hold_oldest_seconds{kind} the oldest's
// age. A hold the decode never reads shows as a count that climbs through
// the bounds.
type HoldAges struct {
	src     atomic.Pointer[func(yield func(age time.Duration, kind string))]
	byAge   *prometheus.Desc
	oldest  *prometheus.Desc
	kinds   []string
	buckets []string
}

// NewHoldAges returns the collector, with constLabels on every series; it
// exports nothing until SetSource.
func NewHoldAges(constLabels prometheus.Labels) *HoldAges {
	h := &HoldAges{
		byAge: prometheus.NewDesc("tandem:kv_holds_by_age",
			"KV holds kept for another engine, by kind (decode_leg: a prefill's hold for the decode that pulls it; conversation: a decode's hold for the next turn), that are older than older_than.",
			[]string{"kind", "older_than"}, constLabels),
		oldest: prometheus.NewDesc("tandem:kv_hold_oldest_seconds",
			"Age of the oldest KV hold kept for another engine, by kind (0 when none).",
			[]string{"kind"}, constLabels),
		kinds: []string{HoldDecodeLeg, HoldConversation},
	}
	for _, b := range HoldAgeBounds {
		h.buckets = append(h.buckets, strconv.Itoa(int(b/time.Second))+"s")
	}
	return h
}

// SetSource makes src the holds the collector reads: src calls yield once
// per hold, with its age and kind, and must be safe to call from a scrape.
// A later call replaces an earlier one (an engine has one lease table).
func (h *HoldAges) SetSource(src func(yield func(age time.Duration, kind string))) {
	h.src.Store(&src)
}

// Describe implements prometheus.Collector.
func (h *HoldAges) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.byAge
	ch <- h.oldest
}

// Collect implements prometheus.Collector.
func (h *HoldAges) Collect(ch chan<- prometheus.Metric) {
	counts := make([][]int, len(h.kinds))
	for i := range counts {
		counts[i] = make([]int, len(HoldAgeBounds))
	}
	oldest := make([]time.Duration, len(h.kinds))
	if src := h.src.Load(); src != nil {
		(*src)(func(age time.Duration, kind string) {
			k := 0
			if kind == HoldConversation {
				k = 1
			}
			for b, bound := range HoldAgeBounds {
				if age >= bound {
					counts[k][b]++
				}
			}
			oldest[k] = max(oldest[k], age)
		})
	}
	for k, kind := range h.kinds {
		for b, label := range h.buckets {
			ch <- prometheus.MustNewConstMetric(h.byAge, prometheus.GaugeValue, float64(counts[k][b]), kind, label)
		}
		ch <- prometheus.MustNewConstMetric(h.oldest, prometheus.GaugeValue, oldest[k].Seconds(), kind)
	}
}
