package sched

import (
	"fmt"
	"slices"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// The connector's completions (sched/doc.go, "KV loads"): asynchronous loads
// that ended (promote) or whose blocks failed (markInvalid, under the load
// failure policy), and held blocks the remote side no longer needs.

// UpdateFromConnector applies the worker half's completions: finishedRecving
// ids whose async load ended (successfully or not), finishedSending ids whose
// held blocks the remote side no longer needs, and blocks whose load failed
// (reported no later than the step in which the request appears in
// finishedRecving). Unknown ids are ignored. Requests this finishes are
// reported by the next Schedule.
func (s *Scheduler) UpdateFromConnector(finishedRecving, finishedSending []string, invalidBlocks []int32) {
	s.stalled = false
	if len(invalidBlocks) > 0 {
		s.markInvalid(invalidBlocks)
	}
	for _, id := range finishedRecving {
		r, ok := s.reqs[id]
		if !ok {
			continue
		}
		if r.status.Finished() {
			if r.holdRecv {
				r.holdRecv = false
				s.maybeRelease(r)
			}
			continue
		}
		if r.status == WaitingForRemoteKVs {
			s.promote(r)
		}
	}
	for _, id := range finishedSending {
		if r, ok := s.reqs[id]; ok && r.holdSend {
			r.holdSend = false
			s.maybeRelease(r)
		}
	}
}

// NoteLoadError records why request id's current KV load failed, as the
// connector's worker half explained it; a FINISHED_ERROR under the fail
// policy carries it. Call it before the UpdateFromConnector that reports the
// failed blocks. Unknown ids are ignored.
func (s *Scheduler) NoteLoadError(id, reason string) {
	if r, ok := s.reqs[id]; ok && !r.status.Finished() {
		r.loadErr = reason
	}
}

// loadFailure is the FINISHED_ERROR message of a failed load under the fail
// policy.
func (s *Scheduler) loadFailure(r *Request, block int) string {
	msg := fmt.Sprintf("KV load failed for block %d of the request (policy %q)", block, s.cfg.LoadFailurePolicy)
	if r.loadErr != "" {
		msg += ": " + r.loadErr
	}
	return msg
}

// markInvalid records failed blocks against the requests loading them and
// applies the policy at once to synchronous loads of this step.
func (s *Scheduler) markInvalid(ids []int32) {
	bad := make(map[int32]bool, len(ids))
	for _, id := range ids {
		bad[id] = true
		if id >= 0 && int(id) < s.pool.NumBlocks() {
			s.pool.Uncache(id)
		}
	}
	bs := s.pool.BlockSize()
	affected := func(r *Request) int {
		first := -1
		for _, t := range r.tables {
			for i := r.loadStart / bs; i < s.blocksFor(r.loadEnd) && i < len(t); i++ {
				if t[i] != kvlayout.NullBlock && bad[t[i]] {
					if first < 0 || i < first {
						first = i
					}
					break
				}
			}
		}
		return first
	}
	for _, r := range slices.Clone(s.waiting) {
		if r.status != WaitingForRemoteKVs {
			continue
		}
		if i := affected(r); i >= 0 && (r.firstInvalid < 0 || i < r.firstInvalid) {
			r.firstInvalid = i
		}
	}
	for _, r := range slices.Clone(s.running) {
		if !r.syncLoad {
			continue
		}
		i := affected(r)
		if i < 0 {
			continue
		}
		if s.cfg.LoadFailurePolicy == LoadFailureFail {
			s.finish(r, FinishedError, s.loadFailure(r, i))
			continue
		}
		lost := r.loadEnd - max(i*bs, r.loadStart)
		r.numExternalTokens -= lost
		r.numComputed = i * bs
		r.numCachedBlocks = min(r.numCachedBlocks, i)
		r.discard = true
	}
}

// promote ends r's async load: the loaded tokens count as computed and their
// full blocks enter the prefix cache, up to the first invalid block under the
// recompute policy; under the fail policy a failed load finishes r.
func (s *Scheduler) promote(r *Request) {
	end := r.loadEnd
	r.status = Waiting // the load is over: nothing writes into the blocks any more
	r.fetch = FetchCompletedWaiting
	if r.firstInvalid >= 0 {
		if s.cfg.LoadFailurePolicy == LoadFailureFail {
			s.finish(r, FinishedError, s.loadFailure(r, r.firstInvalid))
			return
		}
		end = max(min(end, r.firstInvalid*s.pool.BlockSize()), r.loadStart)
	}
	r.numExternalTokens += end - r.loadStart
	r.numComputed = min(end, len(r.tokens)-1) // recompute the last token for its logits
	r.firstInvalid, r.loadErr = -1, ""
	s.cacheFullBlocks(r)
	s.slide(r)
}
