package proxy

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// moveEngines moves engines between the pools until the prefill pool has
// the planner's target, until ctx is done. An engine joins its new pool at
// once (switchRole) and may move again only once its old role's work has
// ended, so several engines may be finishing old work at a time.
func (p *Proxy) moveEngines(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.plan.kick:
		}
		for ctx.Err() == nil {
			target := int(p.plan.target.Load())
			pre, dec := p.prefill.list(), p.decode.list()
			var from, to *pool
			switch {
			case len(pre) < target && len(dec) > p.plan.minDecode:
				from, to = p.decode, p.prefill
			case len(pre) > target && len(pre) > p.plan.minPrefill:
				from, to = p.prefill, p.decode
			}
			if from == nil {
				p.planApplied(len(pre))
				break
			}
			movable := slices.DeleteFunc(slices.Clone(from.list()), func(b *backend) bool {
				p.plan.mu.Lock()
				defer p.plan.mu.Unlock()
				_, finishing := p.plan.finishing[b.base]
				return finishing || pinnedWhy(p.plan.roles[b.base]) != ""
			})
			if len(movable) == 0 {
				// The planner's bounds count the pinned: a decision to
				// come; an engine finishing its old work kicks the mover
				// when it has.
				break
			}
			if _, err := p.switchRole(ctx, leastBusy(movable), from, to); err != nil {
				p.log.Warn("planner: role switch failed", "err", err)
				break
			}
		}
	}
}

// planApplied tells the planner that the pools run prefill prefill
// engines from now: the engines of its last change have switched, and it
// measures the new split from here (it ignores a report of another split).
func (p *Proxy) planApplied(prefill int) {
	p.plan.mu.Lock()
	p.plan.pl.Applied(p.now(), prefill)
	p.plan.mu.Unlock()
}

// leastBusy is the backend with the fewest requests and held KV on it.
func leastBusy(bs []*backend) *backend {
	return slices.MinFunc(bs, func(a, b *backend) int {
		return int((a.inFlight.Load() + a.holds.Load()) - (b.inFlight.Load() + b.holds.Load()))
	})
}

// switchRole moves b from one pool to the other at once: it leaves its
// pool (no new leg of its old role) and joins the other as soon as a
// health check passes. What it still does for its old role — its legs in
// flight, and the KV it holds for decode legs already sent, read or
// released when those end — goes on to the end in the background: nothing
// is dropped or released early. Until that work has ended (at most
// Config.DrainTimeout) the engine is not moved again nor counted as
// switched; done is closed then. The engines serve both roles (tandem
// serve --role both), so nothing on the engine changes: the pools are the
// proxy's.
func (p *Proxy) switchRole(ctx context.Context, b *backend, from, to *pool) (done <-chan struct{}, err error) {
	move := fmt.Sprintf("%s %s→%s", b.base, from.role, to.role)
	p.plan.moving.Store(&move)
	defer p.plan.moving.Store(nil)
	rest := slices.DeleteFunc(urlsOf(from), func(u string) bool { return u == b.base })
	if err := p.SetBackends(from.role, rest); err != nil {
		return nil, fmt.Errorf("taking %s out of the %s pool: %w", b.base, from.role, err)
	}
	if err := p.SetBackends(to.role, append(urlsOf(to), b.base)); err != nil {
		// Back where it was: it still serves its old role.
		if err2 := p.SetBackends(from.role, append(urlsOf(from), b.base)); err2 != nil {
			p.log.Warn("planner: could not put the engine back in its pool", "backend", b.base, "role", from.role, "err", err2)
		}
		return nil, fmt.Errorf("adding %s to the %s pool: %w", b.base, to.role, err)
	}
	p.plan.mu.Lock()
	p.plan.finishing[b.base] = from.role + "→" + to.role
	p.plan.mu.Unlock()
	p.log.Info("planner: engine joined its new pool", "backend", b.base, "from", from.role, "to", to.role,
		"old_in_flight", b.inFlight.Load(), "old_held_kv", b.holds.Load())
	ch := make(chan struct{})
	p.plan.bg.Go(func() {
		defer close(ch)
		p.finishOldRole(ctx, b, from, to)
	})
	return ch, nil
}

// finishOldRole waits until old — the backend b was in its old pool, whose
// counters are that role's work only — has no leg in flight and holds no
// KV, or Config.DrainTimeout has passed; then the engine counts as
// switched and the mover may move it again.
func (p *Proxy) finishOldRole(ctx context.Context, old *backend, from, to *pool) {
	start := time.Now()
	deadline := start.Add(p.cfg.DrainTimeout)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for old.inFlight.Load() > 0 || old.holds.Load() > 0 {
		if time.Now().After(deadline) {
			p.plan.drainOver.Inc()
			p.log.Warn("planner: the engine's old work has not ended in time; it may be moved again", "backend", old.base, "from", from.role,
				"in_flight", old.inFlight.Load(), "held_kv", old.holds.Load(), "drain_timeout", p.cfg.DrainTimeout)
			break
		}
		select {
		case <-ctx.Done():
			return // stopping: the work goes on, nothing more to count
		case <-t.C:
		}
	}
	p.plan.mu.Lock()
	delete(p.plan.finishing, old.base)
	p.plan.mu.Unlock()
	p.plan.switches.WithLabelValues(to.role).Inc()
	p.log.Info("planner: engine switched role", "backend", old.base, "from", from.role, "to", to.role,
		"old_work_ended_in", time.Since(start).Round(time.Millisecond))
	select {
	case p.plan.kick <- struct{}{}:
	default:
	}
}
