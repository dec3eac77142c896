package sched

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

// The Scheduler: its configuration and construction, the inputs outside a
// step (Add, Abort, Fail), the queries of the step loop, and a request's end
// (finish, with the blocks freed or held for the connector). A step is in
// step.go, admission in admit.go, the connector's completions in
// remotekv.go.

// Config bounds what one step may schedule.
type Config struct {
	// MaxNumSeqs is the most requests running at once (default 256).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the most tokens computed in one step, prefill
	// chunks and decodes together (default 2048).
	MaxNumBatchedTokens int
	// LoadFailurePolicy applies to blocks the connector failed to load
	// (default LoadFailureFail, as vLLM).
	LoadFailurePolicy LoadFailurePolicy
	// PrefillScheduleInterval N > 1 is vLLM's prefill_schedule_interval:
	// while requests decode, prefill compute runs only on a step at least N
	// steps after the last one that carried prefill (see the package
	// documentation, "Prefill cadence"). 0 and 1 mean every step.
	PrefillScheduleInterval int
	// MaxConcurrentLoads bounds the asynchronous KV loads in flight
	// (default DefaultMaxConcurrentLoads); further requests with KV to
	// load wait for one to end.
	MaxConcurrentLoads int
	// MaxLoadShare is the share of the pool's blocks that loads in flight
	// may hold together (default DefaultMaxLoadShare). A load that finds
	// no other in flight may take more, so no request is too large to load.
	MaxLoadShare float64
	// GroupWindows are the attention windows of the pool's KV-cache groups
	// (kvlayout.Windows), one per group, 0 for full attention; nil means
	// one full-attention group. A request gets one block table per group;
	// a sliding-window group keeps only the blocks its window can still
	// see. The connector sees every group's table (Request.Tables).
	GroupWindows []int
}

// DefaultMaxNumBatchedTokens is Config.MaxNumBatchedTokens's default.
const DefaultMaxNumBatchedTokens = 2048

// Defaults of Config's load bounds.
const (
	DefaultMaxConcurrentLoads = 8
	DefaultMaxLoadShare       = 0.5
)

// Stats is a snapshot of the scheduler's queues.
type Stats struct {
	Running int
	// Waiting counts queued requests, WAITING_FOR_REMOTE_KVS included.
	Waiting int
	// Held counts finished requests whose blocks the connector still holds.
	Held int
	// Preemptions is the total number of preemptions so far.
	Preemptions uint64
	// FetchWaiting, FetchInProgress and FetchLoaded count the requests
	// whose KV comes from a remote engine by fetch stage: the connector
	// offered a load that has not started (load bound or memory),
	// WAITING_FOR_REMOTE_KVS, and loaded but not scheduled yet.
	FetchWaiting, FetchInProgress, FetchLoaded int
	// PrefillDeferredSteps counts steps in which the prefill cadence held
	// back prefill compute that could have run; CadenceLiftedSteps counts
	// off-cadence steps that ran prefill because the capacity-bound guard
	// was set.
	PrefillDeferredSteps, CadenceLiftedSteps uint64
}

// Scheduler decides what each engine step computes. It is not safe for
// concurrent use.
type Scheduler struct {
	cfg  Config
	pool *kvcache.Blocks
	conn Connector

	reqs     map[string]*Request // live or held
	waiting  []*Request          // FCFS; preempted requests at the front
	running  []*Request          // admission order, newest last
	finished []Finished          // not reported yet

	// stalled is set by a Schedule that changed nothing (every waiting
	// request blocked on memory or loading, nothing running) and cleared by
	// any input that could change that; while it is set HasWork is false,
	// so the step loop sleeps instead of asking again.
	stalled bool
	// shortOfBlocks is set by a Schedule that left a waiting request
	// unadmitted for lack of free blocks.
	shortOfBlocks bool

	preemptions uint64
	// prefixLookups counts admit's prefix-cache lookups of waiting
	// requests.
	prefixLookups uint64

	// The prefill cadence: sincePrefill steps (that scheduled something)
	// since the last one that carried prefill compute, saturating at the
	// interval; capacityBound is the guard, set after an admitting step
	// that preempted nothing left requests waiting.
	sincePrefill  int
	capacityBound bool
	deferred      uint64
	lifted        uint64
}

// New returns a scheduler allocating from pool. A nil connector means
// NoConnector.
func New(cfg Config, pool *kvcache.Blocks, conn Connector) (*Scheduler, error) {
	if pool == nil {
		return nil, errors.New("sched: nil pool")
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = 256
	}
	if cfg.MaxNumBatchedTokens == 0 {
		cfg.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if cfg.LoadFailurePolicy == "" {
		cfg.LoadFailurePolicy = LoadFailureFail
	}
	if cfg.PrefillScheduleInterval == 0 {
		cfg.PrefillScheduleInterval = 1
	}
	if cfg.MaxConcurrentLoads == 0 {
		cfg.MaxConcurrentLoads = DefaultMaxConcurrentLoads
	}
	if cfg.MaxLoadShare == 0 {
		cfg.MaxLoadShare = DefaultMaxLoadShare
	}
	if cfg.MaxNumSeqs < 0 || cfg.MaxNumBatchedTokens < 0 {
		return nil, fmt.Errorf("sched: max-num-seqs %d and max-num-batched-tokens %d must be positive", cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens)
	}
	if cfg.PrefillScheduleInterval < 0 {
		return nil, fmt.Errorf("sched: prefill schedule interval %d must be at least 1 (1: prefill on every step)", cfg.PrefillScheduleInterval)
	}
	if cfg.MaxConcurrentLoads < 0 || cfg.MaxLoadShare < 0 || cfg.MaxLoadShare > 1 {
		return nil, fmt.Errorf("sched: max concurrent loads %d must be positive and the loads' pool share %v in (0, 1]", cfg.MaxConcurrentLoads, cfg.MaxLoadShare)
	}
	if cfg.LoadFailurePolicy != LoadFailureFail && cfg.LoadFailurePolicy != LoadFailureRecompute {
		return nil, fmt.Errorf("sched: unknown KV load failure policy %q: use %q or %q", cfg.LoadFailurePolicy, LoadFailureFail, LoadFailureRecompute)
	}
	if conn == nil {
		conn = NoConnector{}
	}
	for _, w := range cfg.GroupWindows {
		if w < 0 {
			return nil, fmt.Errorf("sched: KV-cache group window %d must be 0 (full attention) or positive", w)
		}
	}
	return &Scheduler{cfg: cfg, pool: pool, conn: conn, reqs: make(map[string]*Request), sincePrefill: cfg.PrefillScheduleInterval}, nil
}

// Config returns the configuration with defaults applied.
func (s *Scheduler) Config() Config { return s.cfg }

// Add queues a request. It fails for a malformed request (empty prompt,
// non-positive MaxTokens, an id already live); a request that can never fit
// in the pool is accepted and finishes with FINISHED_ERROR in the next
// Schedule, after the connector has seen it.
func (s *Scheduler) Add(r *Request) error {
	switch {
	case r == nil:
		return errors.New("sched: nil request")
	case len(r.Prompt) == 0:
		return fmt.Errorf("sched: request %q has an empty prompt", r.ID)
	case r.MaxTokens <= 0:
		return fmt.Errorf("sched: request %q has max tokens %d, want at least 1", r.ID, r.MaxTokens)
	}
	if _, dup := s.reqs[r.ID]; dup {
		return fmt.Errorf("sched: request id %q is already in use", r.ID)
	}
	r.status = Waiting
	r.tokens = slices.Clip(slices.Clone(r.Prompt))
	r.numComputed, r.tables, r.hashes, r.numCachedBlocks = 0, nil, nil, 0
	r.fetch = FetchNone
	r.numCachedTokens, r.numExternalTokens, r.numPreemptions = -1, 0, 0
	r.firstInvalid = -1
	s.reqs[r.ID] = r
	s.waiting = append(s.waiting, r)
	s.stalled = false
	s.conn.OnNewRequest(r)
	// The last sampled token is never fed back, so it needs no KV slot.
	need := s.peakBlocks(len(r.Prompt) + r.MaxTokens - 1)
	if need > s.pool.NumBlocks() {
		s.finish(r, FinishedError, fmt.Sprintf("request needs %d KV blocks for %d prompt + %d max tokens, but the whole pool has %d: lower max_tokens or shorten the prompt, or give the engine more KV-cache memory",
			need, len(r.Prompt), r.MaxTokens, s.pool.NumBlocks()))
	}
	return nil
}

// Abort finishes a request with FINISHED_ABORTED and reports whether it was
// live. Aborting a request that already finished (even one whose blocks the
// connector still holds) changes nothing.
func (s *Scheduler) Abort(id string) bool {
	r, ok := s.reqs[id]
	if !ok || r.status.Finished() {
		return false
	}
	s.finish(r, FinishedAborted, "")
	s.stalled = false
	return true
}

// Fail finishes a live request with FINISHED_ERROR (for example when the
// model failed on its batch) and reports whether it was live.
func (s *Scheduler) Fail(id, msg string) bool {
	r, ok := s.reqs[id]
	if !ok || r.status.Finished() {
		return false
	}
	s.finish(r, FinishedError, msg)
	s.stalled = false
	return true
}

// Stats returns the queue lengths.
func (s *Scheduler) Stats() Stats {
	st := Stats{Running: len(s.running), Waiting: len(s.waiting), Held: len(s.reqs) - len(s.running) - len(s.waiting), Preemptions: s.preemptions,
		PrefillDeferredSteps: s.deferred, CadenceLiftedSteps: s.lifted}
	for _, r := range s.waiting {
		switch r.FetchStage() {
		case FetchWaitingToStart:
			st.FetchWaiting++
		case FetchInProgress:
			st.FetchInProgress++
		case FetchCompletedWaiting:
			st.FetchLoaded++
		}
	}
	return st
}

// ShortOfBlocks reports whether the last Schedule left a waiting request
// unadmitted because the pool had too few free blocks (not because of the
// token budget or a load in flight): the step loop then asks the KV
// connector to give up holds it may release.
func (s *Scheduler) ShortOfBlocks() bool { return s.shortOfBlocks }

// HasWork reports whether calling Schedule can make progress or report
// something without any new input: a request is runnable or a finish is
// pending. Requests waiting only for the connector do not count, nor do
// requests blocked on memory: after a Schedule that changed nothing, HasWork
// is false until an input that might unblock them (Add, Abort, Fail,
// UpdateFromConnector), since the scheduler is deterministic and the same
// Schedule would change nothing again. A request the connector skipped with
// ErrRetryLater keeps HasWork true: the connector's readiness is outside
// the scheduler's state.
func (s *Scheduler) HasWork() bool {
	if len(s.finished) > 0 {
		return true
	}
	if s.stalled {
		return false
	}
	if len(s.running) > 0 {
		return true
	}
	for _, r := range s.waiting {
		if r.status != WaitingForRemoteKVs {
			return true
		}
	}
	return false
}

// Request returns a live or held request by id.
func (s *Scheduler) Request(id string) (*Request, bool) {
	r, ok := s.reqs[id]
	return r, ok
}

func (s *Scheduler) blocksFor(tokens int) int {
	bs := s.pool.BlockSize()
	return (tokens + bs - 1) / bs
}

func (s *Scheduler) release(r *Request) {
	// The pool only reports blocks freed without a reference, which the
	// scheduler never does: each id in r.tables (null entries aside)
	// holds exactly one.
	for _, t := range r.tables {
		_ = s.pool.Free(held(t))
	}
	r.tables = nil
}

// finish moves r to a final status, tells the connector, and frees or holds
// its blocks.
func (s *Scheduler) finish(r *Request, st Status, msg string) {
	loading := r.status == WaitingForRemoteKVs
	switch r.status {
	case Running:
		s.running = slices.DeleteFunc(s.running, func(x *Request) bool { return x == r })
	case Waiting, WaitingForRemoteKVs, Preempted:
		s.waiting = slices.DeleteFunc(s.waiting, func(x *Request) bool { return x == r })
	}
	r.status, r.errMsg, r.syncLoad = st, msg, false
	delay, params := s.conn.RequestFinished(r, r.Blocks())
	r.holdSend = delay && r.hasBlocks()
	r.holdRecv = loading
	s.finished = append(s.finished, Finished{Req: r, Status: st, Err: msg, KVTransfer: params})
	s.maybeRelease(r)
}

func (s *Scheduler) maybeRelease(r *Request) {
	if r.holdRecv || r.holdSend {
		return
	}
	s.release(r)
	delete(s.reqs, r.ID)
}
