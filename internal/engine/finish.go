package engine

import (
	"errors"
	"time"

	"github.com/tandem-serve/tandem/internal/logid"
	"github.com/tandem-serve/tandem/internal/sched"
)

var finishReasons = map[sched.Status]FinishReason{
	sched.FinishedStopped: FinishStop,
	sched.FinishedLength:  FinishLength,
	sched.FinishedAborted: FinishAbort,
	sched.FinishedError:   FinishError,
}

// finish sends the final event of each finished request, records its
// metrics and logs it.
func (e *Engine) finish(fs []sched.Finished, now time.Time) {
	for _, f := range fs {
		rs := e.reqs[f.Req.ID]
		if rs == nil || rs.sr != f.Req {
			continue
		}
		delete(e.reqs, rs.id)
		reason := finishReasons[f.Status]
		usage := Usage{PromptTokens: len(rs.req.Prompt), CompletionTokens: len(f.Req.Output()), CachedTokens: f.Req.NumCachedTokens() + f.Req.NumExternalTokens()}
		ev := Event{Finish: reason, KVTransfer: f.KVTransfer, Usage: usage}
		if reason == FinishStop {
			ev.StopReason = rs.stopReason
		}
		if reason == FinishError {
			ev.Err = errors.New(f.Err)
		}
		e.release(rs.ext)
		rs.out.push(ev, true)

		e2e := now.Sub(rs.arrival)
		var ttft time.Duration
		if !rs.firstToken.IsZero() {
			ttft = rs.firstToken.Sub(rs.arrival)
		}
		if e.m != nil {
			e.m.RequestSuccess.WithLabelValues(string(reason)).Inc()
			e.m.E2ELatency.Observe(e2e.Seconds())
		}
		// The internal id is what a KV hold is keyed by (docs/security.md,
		// "Request ids"): a tag of it at info level, the raw id at debug;
		// the client's id correlates with the proxy's and client's logs.
		attrs := append([]any{"request_id", rs.ext}, logid.Attrs(e.log, "id", rs.id)...)
		attrs = append(attrs, "prompt_tokens", usage.PromptTokens, "output_tokens", usage.CompletionTokens,
			"cached_tokens", usage.CachedTokens, "external_tokens", f.Req.NumExternalTokens(), "preemptions", f.Req.NumPreemptions(),
			"finish_reason", string(reason), "ttft", ttft, "e2e", e2e)
		if f.Err != "" {
			attrs = append(attrs, "err", f.Err)
		}
		e.log.Info("request finished", attrs...)
	}
}

// reject finishes a request the scheduler never took.
func (e *Engine) reject(rs *reqState, reason FinishReason, err error) {
	e.release(rs.ext)
	rs.out.push(Event{Finish: reason, Err: err, Usage: Usage{PromptTokens: len(rs.req.Prompt)}}, true)
}

// release frees a finished request's external id for reuse. It runs before
// the final event is pushed, so a caller that has seen a request end can
// submit the same id again at once (the decode leg of a request on an engine
// that also did its prefill).
func (e *Engine) release(ext string) {
	e.mu.Lock()
	delete(e.live, ext)
	e.mu.Unlock()
}

// publishStats refreshes Stats and the gauges.
func (e *Engine) publishStats() {
	if e.cfg.KVEvents != nil {
		e.cfg.KVEvents.Flush() // the step's KV events, without blocking
	}
	st := e.sched.Stats()
	s := Stats{Running: st.Running, Waiting: st.Waiting, KVUsage: e.pool.Usage(), FreeBlocks: e.pool.FreeBlocks(), TotalBlocks: e.pool.NumBlocks()}
	e.mu.Lock()
	e.stats = s
	e.mu.Unlock()
	if e.m != nil {
		e.m.NumRequestsRunning.Set(float64(s.Running))
		e.m.NumRequestsWaiting.Set(float64(s.Waiting))
		e.m.KVCacheUsage.Set(s.KVUsage)
		q, h := e.pool.PrefixStats()
		e.m.PrefixCacheQueries.Add(float64(q - e.prefixQ))
		e.m.PrefixCacheHits.Add(float64(h - e.prefixH))
		e.prefixQ, e.prefixH = q, h
		e.m.PrefillStepsDeferred.Add(float64(st.PrefillDeferredSteps - e.deferred))
		e.m.PrefillCadenceLifted.Add(float64(st.CadenceLiftedSteps - e.lifted))
		e.deferred, e.lifted = st.PrefillDeferredSteps, st.CadenceLiftedSteps
		e.m.KVFetchByStage.WithLabelValues(sched.FetchWaitingToStart.String()).Set(float64(st.FetchWaiting))
		e.m.KVFetchByStage.WithLabelValues(sched.FetchInProgress.String()).Set(float64(st.FetchInProgress))
		e.m.KVFetchByStage.WithLabelValues(sched.FetchCompletedWaiting.String()).Set(float64(st.FetchLoaded))
	}
}
