package sched

import (
	"encoding/json"
	"slices"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// One engine step (sched/doc.go, "A step"): what Schedule hands the caller
// (Output) and what the caller hands Update (Result); Schedule assembles
// the step (running requests first, preempting when blocks run out, then
// waiting ones through admit), Update applies the model's results.

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
