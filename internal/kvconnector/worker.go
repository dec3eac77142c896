package kvconnector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/logid"
	"github.com/tandem-serve/tandem/internal/sched"
)

// The worker half: pulls, notifications, lease sweeps and releases, on
// goroutines of their own that report to the step loop by message.

// Step implements engine.KVWorker: it starts the step's pulls and
// notifications and cancels pulls of finished requests (meta, built by
// BuildConnectorMeta), sweeps expired leases and returns the prefill's
// released requests as finished_sending. Pulls report through
// Engine.ReportKV when they end.
func (c *Connector) Step(meta sched.ConnectorMeta) (engine.KVCompletions, error) {
	var out engine.KVCompletions
	c.mu.Lock()
	pulled := c.pulled
	c.pulled = nil
	c.mu.Unlock()
	for _, id := range pulled {
		// The pull ended (its report is already queued for the step loop):
		// nothing is left to cancel when the request finishes.
		if st := c.reqs[id]; st != nil && st.phase == loading {
			st.phase = consumed
		}
	}
	if meta != nil {
		meta.Start()
	}
	if c.prod != nil {
		c.prod.Sweep(c.cfg.Clock.Now())
		out.FinishedSending = releasedIDs(c.prod.TakeReleased())
		c.updateHoldGauge()
	}
	return out, nil
}

// Start implements sched.ConnectorMeta: the worker half cancels, notifies
// and pulls what the scheduler half staged for the step.
func (m *connMeta) Start() {
	c := m.c
	c.mu.Lock()
	for _, id := range m.cancels {
		if cancel := c.inflight[id]; cancel != nil {
			cancel()
		}
	}
	c.mu.Unlock()
	for _, n := range m.notifies {
		c.goNotify(n)
	}
	for _, p := range m.pulls {
		c.startPull(p)
	}
}

// RelieveMemory implements engine.MemoryReliever: it gives up the oldest
// conversation holds (never a prefill's hold for a waiting decode leg) when
// new requests lack blocks — under memory pressure new requests win over
// kept conversations, whose next turn then recomputes its history.
func (c *Connector) RelieveMemory(want int) engine.KVCompletions {
	if c.prod == nil || !c.cfg.Bidirectional || c.prod.Evict(want, c.cfg.Clock.Now()) == 0 {
		return engine.KVCompletions{}
	}
	c.updateHoldGauge()
	return engine.KVCompletions{FinishedSending: releasedIDs(c.prod.TakeReleased())}
}

func (c *Connector) updateHoldGauge() {
	if m := c.cfg.Metrics; m != nil && c.cfg.Bidirectional && c.prod != nil {
		m.ConversationHolds.Set(float64(c.prod.FixedHolds()))
	}
}

// startPull runs one pull on a goroutine. The destination slices are taken
// here, on the step loop, which owns the pool.
func (c *Connector) startPull(j pullJob) {
	dst := make([][]byte, len(j.blocks))
	for i, b := range j.blocks {
		dst[i] = c.pool.BlockBytes(b)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.report(failedLoad(j, errors.New("kv connector closed")))
		return
	}
	ctx, cancel := context.WithTimeout(c.base, c.cfg.PullTimeout)
	c.inflight[j.id] = cancel
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		var err error
		switch {
		case j.expired != nil:
			err = j.expired
		case len(j.params.BlockIDs) != len(j.blocks) || len(j.blocks) == 0:
			err = fmt.Errorf("kv pull of request %q: %d remote blocks for %d local ones (engine bug)", j.id, len(j.params.BlockIDs), len(j.blocks))
		default:
			err = c.cons.Pull(ctx, j.params, dst)
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("kv pull did not complete within its %v deadline: %w", c.cfg.PullTimeout, err)
		}
		c.cons.Unwatch(j.params.Peer(), j.params.RequestID)
		c.mu.Lock()
		delete(c.inflight, j.id)
		c.pulled = append(c.pulled, j.id)
		c.mu.Unlock()
		cancel()
		c.countHistoryPull(j.history, err)
		if err != nil {
			c.log.Warn("kv pull failed; --kv-load-failure-policy decides: the decode recomputes the prompt, or the client gets a generic error", "id", j.id, "remote_engine_id", j.params.EngineID,
				"remote_addr", j.params.Peer().Addr(), "reason", failureReason(err), "err", logid.Redact(err.Error(), j.params.RequestID))
			c.report(failedLoad(j, err))
			return
		}
		c.report(engine.KVCompletions{FinishedRecving: []string{j.id}})
	}()
}

// countHistoryPull counts a turn-2 prefill's history pull once it ended:
// the tokens pulled, and a history rewritten after its first block as
// history_mismatch_partial (the blocks before the edit were pulled); or the
// pull's failure as the reason the history is recomputed (the load-failure
// policy then computes it here, or fails the leg and the proxy retries it
// without the history). An abort (canceled) recomputes nothing.
func (c *Connector) countHistoryPull(h *historyPull, err error) {
	m := c.cfg.Metrics
	if h == nil || m == nil {
		return
	}
	switch reason := failureReason(err); {
	case err == nil:
		m.HistoryTokensPulled.Add(float64(h.tokens))
		if h.recompute != "" {
			c.countHistory(reasonMismatchPartial)
		}
	case reason != "canceled":
		c.countHistory(reason)
	}
}

// failedLoad reports a pull that failed: every destination block is
// invalid (its contents are undefined), and the reason goes with it. The
// reason reaches the client (the engine's error answer), so it says nothing
// about what the network did (whether an address answered, refused or
// timed out, or failed to authenticate): only what an authenticated prefill
// engine answered (incompatible, lease expired or released, restarted,
// block reused) is spelled out, as those tell an operator what to change,
// with the prefill's engine id and internal request id replaced by tags
// (logid.Redact). The engine log has the details, under the request's id.
func failedLoad(j pullJob, err error) engine.KVCompletions {
	why := "the prompt's KV could not be loaded from the prefill engine; the decode engine's log has the details under this request's X-Request-Id — retry the request"
	switch {
	case errors.Is(err, kvxfer.ErrSignatureExpired):
		why = "the kv_transfer_params expired: this leg arrived after the engine that issued them stopped holding their KV (a prefill's --kv-lease, or a decode's --kv-decode-hold-ttl, ended), so that KV is gone — retry the whole request, or run this engine with --kv-load-failure-policy recompute to compute the prompt here instead"
	case fromAuthenticatedPeer(err):
		msg := logid.Redact(logid.Redact(err.Error(), j.params.RequestID), j.params.EngineID)
		why = fmt.Sprintf("pulling the prompt's KV from the prefill engine failed (%s): %s", kvxfer.FailureReason(err), msg)
	}
	return engine.KVCompletions{
		FinishedRecving: []string{j.id},
		InvalidBlocks:   j.blocks,
		LoadErrors:      map[string]string{j.id: why},
	}
}

// failureReason is kvxfer.FailureReason, but expired for params whose
// signature expired (which kvxfer counts as unauthenticated).
func failureReason(err error) string {
	if errors.Is(err, kvxfer.ErrSignatureExpired) {
		return rejectedExpired
	}
	return kvxfer.FailureReason(err)
}

// fromAuthenticatedPeer reports errors only an authenticated producer's
// answer can cause.
func fromAuthenticatedPeer(err error) bool {
	for _, e := range []error{kvxfer.ErrIncompatible, kvxfer.ErrNotHeld, kvxfer.ErrPeerRestarted, kvxfer.ErrGenerationChanged, kvxfer.ErrBadBlock} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// goNotify tells a prefill to free a request's KV, on a goroutine.
func (c *Connector) goNotify(n notifyJob) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		c.cons.Unwatch(n.peer, n.reqID)
		ctx, cancel := context.WithTimeout(c.base, c.cfg.NotifyTimeout)
		defer cancel()
		if err := c.cons.Notify(ctx, n.peer, n.reqID); err != nil && !errors.Is(err, kvxfer.ErrNotHeld) {
			// The KV stays held until its lease ends: name it by its tag.
			attrs := append([]any{"remote_engine_id", n.peer.EngineID}, logid.Attrs(c.log, "remote_request_id", n.reqID)...)
			c.log.Warn("cannot tell the prefill engine to free KV this engine will not read; it frees it when the lease expires",
				append(attrs, "reason", kvxfer.FailureReason(err), "err", logid.Redact(err.Error(), n.reqID))...)
		}
	}()
}

// sweepLoop expires leases while the engine is idle (Step sweeps while it
// runs), so held blocks return to the pool without a request to drive the
// step loop.
func (c *Connector) sweepLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.prod.Sweep(c.cfg.Clock.Now())
			c.drainReleases()
		}
	}
}

// drainReleases hands the producer's releases to the step loop.
func (c *Connector) drainReleases() {
	if ids := releasedIDs(c.prod.TakeReleased()); len(ids) > 0 {
		// An idle engine runs no Step to refresh the gauge.
		c.updateHoldGauge()
		c.report(engine.KVCompletions{FinishedSending: ids})
	}
}

func releasedIDs(rs []kvxfer.Release) []string {
	if len(rs) == 0 {
		return nil
	}
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.RequestID
	}
	return ids
}
