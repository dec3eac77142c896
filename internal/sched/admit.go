package sched

import (
	"errors"
	"fmt"
)

// The prefill cadence's clock and admission: what a step may admit, how
// remote-KV loads are bounded and what they reserve (sched/doc.go, "Prefill
// cadence" and "KV loads").

// tick advances the cadence clock after a step: it restarts when the step
// carried heavy prefill compute and counts the step otherwise (a step that
// scheduled nothing does not count; loads and light admissions neither
// restart nor count against it beyond their step). The capacity-bound guard
// is set after a step that admitted heavy prefill and preempted nothing if
// requests still wait for compute; a preempting step leaves it as it was.
func (s *Scheduler) tick(out *Output, prefill, admitted, deferred, lifted bool) {
	if s.cfg.PrefillScheduleInterval <= 1 {
		return
	}
	switch {
	case prefill:
		s.sincePrefill = 0
	case len(out.Scheduled) > 0:
		s.sincePrefill = min(s.sincePrefill+1, s.cfg.PrefillScheduleInterval)
	}
	if admitted && len(out.Preempted) == 0 {
		s.capacityBound = false
		for _, r := range s.waiting {
			if r.status != WaitingForRemoteKVs {
				s.capacityBound = true
				break
			}
		}
	}
	if deferred {
		s.deferred++
	}
	if lifted {
		s.lifted++
	}
}

// light reports whether r, with computed tokens done, has at most one
// block's worth of tokens left to compute before it decodes: a request
// whose KV was loaded (only its last prompt token is left), a near-total
// prefix-cache hit, the last small chunk of a prefill. The cadence lets
// light work through on every step and does not count it as prefill: it
// costs about what a decode does.
func (s *Scheduler) light(r *Request, computed int) bool {
	return len(r.tokens)-computed <= s.pool.BlockSize()
}

// admitMode is what a waiting request may be admitted for in a step.
type admitMode int

const (
	admitAny   admitMode = iota
	admitLight           // deferring off-cadence step: KV loads and light requests
	admitLoads           // budget or seats spent: KV loads only
)

// admission is admit's outcome.
type admission int

const (
	admitShort    admission = iota // too few free blocks: the head of line waits
	admitCompute                   // blocks given: schedule its next chunk
	admitLoad                      // asynchronous KV load started
	admitPass                      // not this step (mode, load bounds): look further, nothing changed
	admitSkip                      // connector not ready, or finished with an error: look further
	admitReleased                  // gave its loaded blocks back for lack of room: the head waits
)

// admit gives waiting request r the blocks it needs to compute its next
// chunk of at most budget tokens (or to load its external tokens), looking
// up the prefix cache and asking the connector first when r has no KV.
func (s *Scheduler) admit(r *Request, budget int, mode admitMode) admission {
	if r.hasBlocks() {
		// KV loaded by the connector: only the rest needs blocks. If even
		// that does not fit, give the blocks back (the loaded full blocks
		// stay in the prefix cache) rather than sit on them.
		if mode == admitLoads || mode == admitLight && !s.light(r, r.numComputed) {
			return admitPass
		}
		n := min(len(r.tokens)-r.numComputed, budget)
		if s.growBlocks(r, r.numComputed+n) {
			return admitCompute
		}
		s.release(r)
		r.numComputed, r.numCachedBlocks, r.fetch = 0, 0, FetchNone
		return admitReleased
	}

	if mode == admitLoads {
		// Only an asynchronous load can start with the budget or the seats
		// spent. A connector that offers none after no local hit offers
		// none after any (Connector), so a request it would not load is
		// passed without the prefix-cache lookup: a step costs a connector
		// question per waiting request, not a lookup of its prompt.
		_, async, err := s.conn.GetNumNewMatchedTokens(r, 0)
		switch {
		case errors.Is(err, ErrRetryLater):
			return admitSkip
		case err != nil:
			s.finish(r, FinishedError, fmt.Sprintf("kv connector: %v", err))
			return admitSkip
		case !async:
			return admitPass
		}
	}

	bs := s.pool.BlockSize()
	s.prefixLookups++
	r.hashes = s.pool.ExtendHashes(r.hashes, r.tokens)
	maxHit := (len(r.tokens) - 1) / bs // never the whole prompt
	k, hit := s.match(r.hashes[:min(maxHit, len(r.hashes))])
	local := k * bs

	ext, async, err := s.conn.GetNumNewMatchedTokens(r, local)
	if errors.Is(err, ErrRetryLater) {
		return admitSkip
	}
	if err != nil {
		s.finish(r, FinishedError, fmt.Sprintf("kv connector: %v", err))
		return admitSkip
	}
	if ext < 0 || local+ext > len(r.tokens) || (async && ext == 0) {
		s.finish(r, FinishedError, fmt.Sprintf("kv connector offered %d external tokens (async %v) after %d local ones for a %d-token request", ext, async, local, len(r.tokens)))
		return admitSkip
	}
	var target int // tokens that need blocks now
	if async {
		target = local + ext
	} else {
		ext = min(ext, len(r.tokens)-1-local) // a sync load still leaves a token to compute
		target = local + ext + min(len(r.tokens)-local-ext, budget)
		if mode == admitLoads || mode == admitLight && !s.light(r, local+ext) {
			return admitPass
		}
	}

	need := s.missing(&Request{tables: hit}, local+ext, target)
	take := need
	for _, t := range hit {
		for _, id := range held(t) {
			if s.pool.RefCount(id) == 0 {
				take++ // a cached free block leaves the free list too
			}
		}
	}
	free := s.pool.FreeBlocks()
	if async {
		// A new load may not take the blocks that loads and prefills in
		// flight still need, nor more than the loads' share of the pool.
		n, held := s.loadsInFlight()
		if n >= s.cfg.MaxConcurrentLoads || n > 0 && float64(held+s.blocksFor(target)) > s.cfg.MaxLoadShare*float64(s.pool.NumBlocks()) {
			r.fetch = FetchWaitingToStart
			return admitPass
		}
		free -= s.reserved()
	}
	if take > free {
		if async {
			r.fetch = FetchWaitingToStart
		}
		s.shortOfBlocks = true
		return admitShort
	}
	for _, t := range hit {
		s.pool.Touch(held(t))
	}
	fresh, ok := s.pool.Allocate(need)
	if !ok { // cannot happen after the check above; keep the pool consistent anyway
		for _, t := range hit {
			s.pool.Free(held(t))
		}
		return admitShort
	}
	r.tables = s.extend(hit, local+ext, target, fresh)
	r.numCachedBlocks = k
	r.numComputed = local
	if r.numCachedTokens < 0 {
		r.numCachedTokens = local
	}
	s.pool.RecordPrefixQuery(len(r.tokens), local)
	s.conn.UpdateStateAfterAlloc(r, r.Blocks(), ext)
	if ext > 0 {
		r.loadStart, r.loadEnd, r.firstInvalid, r.loadErr = local, local+ext, -1, ""
		if async {
			r.status, r.fetch = WaitingForRemoteKVs, FetchInProgress
			return admitLoad
		}
		r.syncLoad = true
		r.numComputed = local + ext
		r.numExternalTokens += ext
	}
	return admitCompute
}

// loadsInFlight returns how many asynchronous loads are in flight, and how
// many blocks they and the loaded requests not running yet hold.
func (s *Scheduler) loadsInFlight() (n, blocks int) {
	for _, r := range s.waiting {
		if r.status == WaitingForRemoteKVs {
			n++
		}
		for _, t := range r.tables {
			blocks += len(held(t))
		}
	}
	return n, blocks
}

// reclaim frees the blocks of the newest loaded request queued behind
// s.waiting[head] (one whose load ended and that waits for a seat or the
// budget), so that the head, short of blocks, can go first: a load started
// out of order, past the budget, never keeps an earlier request out of
// memory. The loaded full blocks stay in the prefix cache, so the request
// usually finds them again; what was evicted meanwhile it computes. It
// reports whether it freed anything. Requests still loading are never
// reclaimed: their blocks are being written.
func (s *Scheduler) reclaim(head int) bool {
	for j := len(s.waiting) - 1; j > head; j-- {
		r := s.waiting[j]
		if r.status == WaitingForRemoteKVs || !r.hasBlocks() {
			continue
		}
		s.release(r)
		r.numComputed, r.numCachedBlocks, r.fetch = 0, 0, FetchNone
		return true
	}
	return false
}

// reserved is how many more blocks the requests in flight need to reach
// their first decode (vLLM's _inflight_prefills): running prefills for the
// rest of their prompt, loading and loaded requests for what follows the
// loaded tokens. A new load may not take them, so concurrent loads can
// neither deadlock each other nor starve a running prefill of blocks.
func (s *Scheduler) reserved() int {
	n := 0
	for _, r := range s.running {
		if !r.decoding() {
			n += s.missing(r, r.numComputed, len(r.tokens))
		}
	}
	for _, r := range s.waiting {
		if r.hasBlocks() {
			n += s.missing(r, r.numComputed, len(r.tokens))
		}
	}
	return n
}
