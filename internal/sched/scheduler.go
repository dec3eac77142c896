package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

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

// Scheduled is one request's work in a step: compute Tokens at positions
// Pos, Pos+1, ... into the blocks of Blocks, and sample the next token after
// the last one if Sample.
type Scheduled struct {
	Req    *Request
	Pos    int
	Tokens []int32
	// Blocks is the request's block table, covering Pos+len(Tokens)
	// tokens (group 0's, with several KV-cache groups).
	Blocks []int32
	// Tables are the block tables of every KV-cache group when the pool
	// has several (nil with one: Blocks is the table).
	Tables [][]int32
	// Sample is true when Tokens ends the request's known tokens, so the
	// model's logits at the last one give the next token.
	Sample bool
}

// Finished reports a request that reached a final status.
type Finished struct {
	Req    *Request
	Status Status
	// Err explains a FinishedError.
	Err string
	// KVTransfer is what Connector.RequestFinished returned for the client.
	KVTransfer json.RawMessage
}

// Output is one step's schedule.
type Output struct {
	// Scheduled lists decodes first, then prefill chunks.
	Scheduled []Scheduled
	// NumTokens is the total number of tokens in Scheduled.
	NumTokens int
	// Preempted lists the requests preempted in this step.
	Preempted []*Request
	// Finished lists requests that finished since the previous Update
	// (aborts, errors, connector completions), for the caller to report.
	Finished []Finished
	// ConnectorMeta is Connector.BuildConnectorMeta's result, for the worker
	// half of the connector.
	ConnectorMeta ConnectorMeta
}

// Result is the caller's outcome for one sampling request of a step.
type Result struct {
	ID    string
	Token int32
	// Finish is FinishedStopped or FinishedLength when this token ends the
	// request (EOS, stop token, stop string, max tokens); zero otherwise.
	Finish Status
}

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

// Schedule decides this step's work. The caller must run it and call Update
// with the results before the next Schedule.
func (s *Scheduler) Schedule() *Output {
	out := &Output{}
	s.shortOfBlocks = false
	budget := s.cfg.MaxNumBatchedTokens
	where := make(map[*Request]int) // index in out.Scheduled

	// The cadence: an off-cadence step defers heavy prefill compute while a
	// request decodes in its place, unless the capacity-bound guard is set.
	offCadence := s.sincePrefill+1 < s.cfg.PrefillScheduleInterval
	deferPrefill := false
	prefill := false  // heavy prefill compute scheduled
	admitted := false // a heavy prefill admitted from the queue
	pending := false  // heavy prefill compute the cadence held back

	// Running requests: decodes first, then continuing prefills.
	throttled := false // off cadence, with decodes to run in prefill's place
	for pass := range 2 {
		if pass == 1 && offCadence && len(out.Scheduled) > 0 {
			throttled, deferPrefill = true, !s.capacityBound
		}
		for i := 0; i < len(s.running) && budget > 0; i++ {
			r := s.running[i]
			if _, done := where[r]; done || r.decoding() != (pass == 0) {
				continue
			}
			n := min(len(r.tokens)-r.numComputed, budget)
			if n <= 0 {
				continue
			}
			heavy := pass == 1 && !s.light(r, r.numComputed)
			if heavy && deferPrefill {
				pending = true
				continue
			}
			fits := true
			for !s.growBlocks(r, r.numComputed+n) {
				victim := s.running[len(s.running)-1]
				if j, ok := where[victim]; ok {
					budget += len(out.Scheduled[j].Tokens)
					out.Scheduled = slices.Delete(out.Scheduled, j, j+1)
					delete(where, victim)
					for k, v := range where {
						if v > j {
							where[k] = v - 1
						}
					}
				}
				s.preempt(victim)
				out.Preempted = append(out.Preempted, victim)
				if victim == r {
					fits = false
					break
				}
			}
			if !fits {
				break // r was the newest; everything after it is gone too
			}
			prefill = prefill || heavy
			where[r] = len(out.Scheduled)
			out.Scheduled = append(out.Scheduled, s.scheduled(r, r.numComputed, n))
			budget -= n
		}
	}

	// Waiting requests, FCFS, unless this step had to preempt. With the
	// budget or the seats spent, the scan goes on for requests whose KV
	// loads from elsewhere (they compute nothing this step, and their load
	// overlaps the running requests); on a deferring off-cadence step it
	// admits only those and light requests.
	changed := false // state changed that out does not show
	_, noLoads := s.conn.(NoConnector)
	for i := 0; len(out.Preempted) == 0 && i < len(s.waiting); {
		r := s.waiting[i]
		if r.status == WaitingForRemoteKVs {
			i++
			continue
		}
		full := budget <= 0 || len(s.running) >= s.cfg.MaxNumSeqs
		if full && noLoads {
			break // nothing is ever loaded: no need to look further
		}
		mode := admitAny
		switch {
		case full:
			mode = admitLoads
		case deferPrefill:
			mode = admitLight
		}
		res := s.admit(r, budget, mode)
		if res == admitPass {
			pending = pending || mode == admitLight && r.fetch != FetchWaitingToStart
			i++
			continue
		}
		if res == admitSkip {
			// Skipped for the connector (retry later: it may be ready next
			// step) or finished with an error (in out.Finished).
			changed = true
			i++
			continue
		}
		if res == admitReleased {
			changed = true
			break
		}
		if res == admitShort {
			if mode != admitLoads && s.reclaim(i) {
				changed = true
				continue // try the head again
			}
			break // head of line waits for memory
		}
		changed = true
		if res == admitLoad {
			i++
			continue
		}
		heavy := !s.light(r, r.numComputed)
		prefill, admitted = prefill || heavy, admitted || heavy
		s.waiting = slices.Delete(s.waiting, i, i+1)
		r.status, r.fetch = Running, FetchNone
		s.running = append(s.running, r)
		n := min(len(r.tokens)-r.numComputed, budget)
		out.Scheduled = append(out.Scheduled, s.scheduled(r, r.numComputed, n))
		budget -= n
	}

	for _, sc := range out.Scheduled {
		out.NumTokens += len(sc.Tokens)
	}
	s.tick(out, prefill, admitted, deferPrefill && pending, throttled && !deferPrefill && prefill)
	out.Finished, s.finished = s.finished, nil
	out.ConnectorMeta = s.conn.BuildConnectorMeta(out)
	s.stalled = !changed && len(out.Scheduled) == 0 && len(out.Preempted) == 0 && len(out.Finished) == 0
	return out
}

// growBlocks makes r's block tables cover tokens, reporting false (and
// changing nothing) when the pool is short.
func (s *Scheduler) growBlocks(r *Request, tokens int) bool {
	need := s.missing(r, r.numComputed, tokens)
	if need <= 0 {
		return true
	}
	ids, ok := s.pool.Allocate(need)
	if !ok {
		return false
	}
	r.tables = s.extend(r.tables, r.numComputed, tokens, ids)
	return true
}

func (s *Scheduler) scheduled(r *Request, pos, n int) Scheduled {
	sc := Scheduled{Req: r, Pos: pos, Tokens: r.tokens[pos : pos+n : pos+n], Blocks: r.Blocks(), Sample: pos+n == len(r.tokens)}
	if len(r.tables) > 1 {
		sc.Tables = r.tables
	}
	return sc
}

// preempt evicts running request r: blocks freed (full ones stay in the
// prefix cache, so the recompute often hits them), front of the queue.
func (s *Scheduler) preempt(r *Request) {
	s.running = slices.DeleteFunc(s.running, func(x *Request) bool { return x == r })
	s.release(r)
	r.numComputed, r.numCachedBlocks, r.syncLoad = 0, 0, false
	r.status = Preempted
	r.numPreemptions++
	s.preemptions++
	s.waiting = slices.Insert(s.waiting, 0, r)
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

// Update applies a step's results: computed tokens advance, full blocks
// enter the prefix cache, sampled tokens are appended, and requests the
// caller stopped (or that reached MaxTokens) finish. results has one entry
// per Sample request of out that is still running. It returns every request
// that finished since Schedule.
func (s *Scheduler) Update(out *Output, results []Result) []Finished {
	byID := make(map[string]Result, len(results))
	for _, res := range results {
		byID[res.ID] = res
	}
	for _, sc := range out.Scheduled {
		r := sc.Req
		if r.status != Running || s.reqs[r.ID] != r {
			continue // finished or failed since Schedule
		}
		r.syncLoad = false
		if r.discard {
			r.discard = false
			continue
		}
		r.numComputed = sc.Pos + len(sc.Tokens)
		s.cacheFullBlocks(r)
		s.slide(r)
		if !sc.Sample {
			continue
		}
		res, ok := byID[r.ID]
		if !ok {
			s.finish(r, FinishedError, "engine reported no token for a sampling step")
			continue
		}
		r.tokens = append(r.tokens, res.Token)
		switch {
		case res.Finish == FinishedStopped || res.Finish == FinishedLength:
			s.finish(r, res.Finish, "")
		case len(r.tokens)-len(r.Prompt) >= r.MaxTokens:
			s.finish(r, FinishedLength, "")
		}
	}
	fin := s.finished
	s.finished = nil
	return fin
}

// cacheFullBlocks registers r's full computed blocks in the prefix cache,
// each group's in its own.
func (s *Scheduler) cacheFullBlocks(r *Request) {
	full := r.numComputed / s.pool.BlockSize()
	if full <= r.numCachedBlocks {
		return
	}
	r.hashes = s.pool.ExtendHashes(r.hashes, r.tokens[:full*s.pool.BlockSize()])
	for g, t := range r.tables {
		for i := r.numCachedBlocks; i < full; i++ {
			if t[i] != kvlayout.NullBlock {
				s.pool.CacheGroup(g, t[i], r.hashes[i])
			}
		}
	}
	r.numCachedBlocks = full
}

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
