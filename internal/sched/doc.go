// Package sched is the engine's request scheduler, after vLLM v1's: FCFS
// admission under a per-step token budget, chunked prefill mixed with decodes
// in one step, preemption by recompute when KV blocks run out, prefix-cache
// reuse through kvcache.Blocks, and the scheduler half of a KV connector that
// lets a disaggregated prefill/decode transfer layer load a request's KV from
// elsewhere or hold its blocks after it finishes.
//
// Like etcd's raft, the scheduler is a pure state machine: it starts no
// goroutine, does no I/O and never reads the clock. The caller (the engine's
// step loop) feeds it requests, aborts, model results and connector
// completions and acts on what it returns:
//
//	s.Add(req) / s.Abort(id) / s.UpdateFromConnector(recv, send, invalid)
//	out := s.Schedule()          // what to compute this step, who finished
//	... run the model on out.Scheduled, sample ...
//	finished := s.Update(out, results)
//
// # Request states
//
//	  Add
//	   |
//	   v        connector: async load         +------------------------+
//	WAITING ------------------------------->  | WAITING_FOR_REMOTE_KVS |
//	   |  ^  <------ finished_recving ------  +------------------------+
//	   |  |   (loaded tokens computed and        abort: FINISHED_ABORTED,
//	   |  |    cached; recompute policy:         blocks kept until
//	   |  |    from the first invalid block;     finished_recving
//	   |  |    fail policy: FINISHED_ERROR)
//	   |
//	   | admitted (blocks, budget, max seqs)
//	   v
//	RUNNING ---- no free block, newest first ----> PREEMPTED (blocks freed,
//	   |  ^                                          |   front of the queue)
//	   |  +------------ re-admitted, recomputed -----+
//	   |
//	   | engine: EOS / stop token / stop string -> FINISHED_STOPPED
//	   |         max tokens                     -> FINISHED_LENGTH
//	   v
//	FINISHED_STOPPED | FINISHED_LENGTH | FINISHED_ABORTED | FINISHED_ERROR
//
// Every state can go to FINISHED_ABORTED (Abort) and FINISHED_ERROR (a
// request that can never fit in the pool, a connector error, a failed KV
// load under the "fail" policy, or the engine's Fail). PREEMPTED behaves as
// WAITING in the queue. A finished request leaves the scheduler at once
// unless the connector asked to delay freeing its blocks (RequestFinished
// returned true: freed when the request id comes back in finished_sending)
// or it was aborted while its KV was loading (freed when it comes back in
// finished_recving, so an in-flight write never lands in a reused block).
//
// # A step
//
// Schedule first gives every running request that is decoding one token,
// then continues running prefills in chunks, then admits waiting requests in
// FCFS order while the token budget (MaxNumBatchedTokens) and MaxNumSeqs
// allow, the last admitted one possibly with a partial chunk. When a running
// request needs a block and none is free, the newest running request is
// preempted (its blocks freed, its computed tokens forgotten) and goes back
// to the front of the waiting queue; nothing new is admitted in a step that
// preempted. A request whose prompt plus maximum output can never fit in the
// whole pool finishes with FINISHED_ERROR instead of cycling forever.
//
// With the budget or the seats spent, the scan of the queue goes on for
// requests whose KV the connector loads asynchronously: they are admitted
// into WAITING_FOR_REMOTE_KVS with zero tokens scheduled, so their loads
// overlap the running requests' steps instead of waiting for budget (vLLM
// #41784, #55724).
//
// # Prefill cadence
//
// With Config.PrefillScheduleInterval N > 1 (vLLM's
// prefill_schedule_interval), a step is on cadence when at least N steps
// that scheduled something have passed since the last step that carried
// heavy prefill compute; an engine has no global grid, so the clock is this
// step count, not time. On an off-cadence step in which a running request
// decodes, every heavy prefill is deferred: continuing chunks and new
// admissions alike. With no decode to run in its place nothing is deferred,
// so the interval never leaves the engine idle.
//
// The capacity-bound guard: after a step that admitted a heavy prefill and
// preempted nothing, the scheduler remembers whether requests (other than
// loading ones) still wait; while that is so, off-cadence steps are not
// throttled, or the queue would grow at saturation. A step that preempted
// admits nothing, so it leaves the guard as it was.
//
// Work is light when the request has at most one block's worth of tokens
// left to compute before it decodes: a request whose KV was loaded (only
// its last prompt token is left), a near-total prefix-cache hit, the last
// small chunk of a prompt. Light work and async-load admissions (which
// compute nothing) run on off-cadence steps too, and neither restarts the
// clock: their cost is a decode's, and a pull should start at once. On a
// prefill-role engine nothing decodes, so the cadence is inert; on a
// decode-role engine it lets every decode leg through and defers only the
// engine's own compute: recomputes after a failed load or a preemption,
// and plain requests. Stats counts the steps it deferred and those the
// guard lifted.
//
// SetPrefillScheduleInterval changes the interval between two steps (the
// engine's admin route, the proxy's planner): the step count is kept and
// clamped to the new interval, so a change neither restarts the clock nor
// holds a prefill back longer than the new interval asks.
//
// # KV loads
//
// An async load allocates blocks for all the tokens it loads when it
// starts. Its request is not preemptible while it loads (the connector is
// writing into its blocks): under memory pressure running requests are
// preempted instead. Three bounds keep loads from starving the rest:
//
//   - At most Config.MaxConcurrentLoads loads are in flight; further
//     requests with KV to load wait (fetch stage waiting_to_start).
//   - Loads in flight and loaded requests not running yet hold at most
//     Config.MaxLoadShare of the pool, except that a load that finds no
//     other in flight may take more, so no request is too large to load.
//   - A new load may not take the blocks that requests in flight still
//     need to reach their first decode (vLLM's _inflight_prefills): the
//     rest of the prompt of running prefills, and what follows the loaded
//     tokens of loading and loaded requests. So concurrent loads can
//     neither deadlock each other nor starve a running prefill.
//
// A load admitted past the budget jumps the queue, so it must not keep an
// earlier request out of memory: when the head of the queue lacks blocks,
// loaded requests queued behind it give theirs back (newest first; the
// loaded full blocks stay in the prefix cache, so they usually find them
// again). Request.FetchStage and Stats report each request's stage:
// waiting_to_start, in_progress (WAITING_FOR_REMOTE_KVS) and
// completed_waiting (loaded, not scheduled yet). A load that never
// completes is the connector's to end: it reports the request in
// finished_recving with its blocks invalid, and the load-failure policy
// applies.
//
// HasWork tells the caller whether another Schedule could change anything.
// Requests loading their KV do not count, and after a Schedule that changed
// nothing (every waiting request blocked on memory, nothing running) neither
// do the blocked ones, until an input that might free memory or add work
// (Add, Abort, Fail, UpdateFromConnector): the scheduler is deterministic,
// so asking again without input would give the same empty answer, and the
// engine's loop would spin.
//
// # Prefix caching
//
// A request admitted with no KV looks up its longest cached prefix of full
// blocks, never the whole prompt (at least one token is computed so there
// are logits to sample). Full blocks are registered in the prefix cache as
// soon as their KV is computed (after each step) or, for blocks loaded by the
// connector, only once the load has finished: blocks under load are never
// prefix hits for others.
//
// # KV-cache groups
//
// With Config.GroupWindows (a model with sliding-window layers, vLLM's
// hybrid KV cache manager) a request has one block table per KV-cache
// group, all of one length, and every group's blocks come from the one
// pool. A full-attention group keeps every block; a sliding-window group
// frees, after each step, the blocks wholly before what its window reads
// from the last computed token on (kvlayout.FirstNeeded) and puts
// kvlayout.NullBlock in their place, so a long sequence holds about a
// window of blocks there (kvlayout.SeqBlocks sizes requests by it). A KV
// load allocates a sliding group's blocks from its window on only. The
// prefix cache is per group, and a hit is the longest prefix that every
// full-attention group caches whole and every sliding group caches from
// its window's start at the hit's end (vLLM's find_longest_cache_hit).
package sched
