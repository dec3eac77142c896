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
package sched
