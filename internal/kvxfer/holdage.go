package kvxfer

import (
	"time"

	"github.com/tandem-serve/tandem/internal/metrics"
)

// exportHoldAges makes the lease table the source of the engine's
// tandem:kv_holds_by_age: each held request's age (since its hold began,
// heartbeats notwithstanding) and kind (a fixed hold is a conversation's).
func (p *Producer) exportHoldAges() {
	m := p.cfg.Metrics
	if m == nil || m.KVHoldAges == nil {
		return
	}
	m.KVHoldAges.SetSource(p.holdAges)
}

// holdAges calls yield with the age and kind of each hold, at the
// producer's clock's now.
func (p *Producer) holdAges(yield func(age time.Duration, kind string)) {
	now := p.cfg.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.leases.held {
		kind := metrics.HoldDecodeLeg
		if l.fixed {
			kind = metrics.HoldConversation
		}
		yield(now.Sub(l.since), kind)
	}
}
