package engine

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sched"
)

// Messages to the step loop, besides a *reqState (Submit) and KVCompletions
// (ReportKV).
type (
	abortMsg    string
	drainMsg    struct{}
	abortAllMsg struct{}
	quitMsg     struct{}
	// dropHoldsMsg ends a drain without waiting for connector holds; the
	// loop answers how many finished requests it still held blocks for.
	dropHoldsMsg struct{ held chan<- int }
)

// inbox is the loop's unbounded message queue: posting never blocks.
type inbox struct {
	mu   sync.Mutex
	msgs []any
	wake chan struct{}
}

func (b *inbox) post(m any) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *inbox) take() []any {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.msgs
	b.msgs = nil
	return m
}

// run is the step loop.
func (e *Engine) run() {
	defer close(e.done)
	for {
		for _, m := range e.in.take() {
			e.handle(m)
		}
		if e.quit {
			return
		}
		// A drain also waits for blocks a connector holds (KV a remote
		// decode has not read yet, loads still writing into aborted
		// requests' blocks), until Drain's hold deadline gives them up.
		// Conversation holds (KV kept for a next turn) are given up at
		// once: this engine will not serve that turn.
		if e.stopping && len(e.reqs) == 0 && !e.idleClosed {
			e.idleClosed = true
			close(e.idle)
		}
		if e.stopping && len(e.reqs) == 0 && e.sched.Stats().Held > 0 && !e.drainedClosed {
			e.relieveMemory(e.pool.NumBlocks())
		}
		if e.stopping && len(e.reqs) == 0 && (e.dropHolds || e.sched.Stats().Held == 0) && !e.drainedClosed {
			e.drainedClosed = true
			close(e.drained)
		}
		// HasWork is false for requests blocked on memory or loading KV, so
		// the loop sleeps until a message (a request, an abort, a KV report
		// that frees or fills blocks, shutdown) might let one progress.
		if !e.sched.HasWork() {
			if e.sched.ShortOfBlocks() && e.relieveMemory(e.reliefStep()) {
				continue
			}
			e.publishStats()
			<-e.in.wake
			continue
		}
		e.step()
	}
}

func (e *Engine) handle(m any) {
	switch m := m.(type) {
	case *reqState:
		if e.abortAll {
			e.RejectKVTransfer(m.req.KVTransfer)
			e.reject(m, FinishAbort, errors.New("engine shut down before the request started"))
			return
		}
		if err := e.sched.Add(m.sr); err != nil {
			e.reject(m, FinishError, err)
			return
		}
		e.reqs[m.id] = m
		if m.req.KVTransfer != nil {
			e.unadmitted = append(e.unadmitted, m)
		}
	case abortMsg:
		e.sched.Abort(string(m))
	case KVCompletions:
		e.kvCompletions(m)
	case drainMsg:
		e.stopping = true
	case abortAllMsg:
		e.abortAll = true
		for id := range e.reqs {
			e.sched.Abort(id)
		}
	case dropHoldsMsg:
		e.dropHolds = true
		m.held <- e.sched.Stats().Held
	case setCadenceMsg:
		e.setCadence(m)
	case quitMsg:
		e.quit = true
	}
}

// relieveMemory asks the KV worker to give up holds it may release so that
// waiting or preempted requests get blocks, and reports whether it did.
func (e *Engine) relieveMemory(want int) bool {
	r, ok := e.cfg.KVWorker.(MemoryReliever)
	if !ok {
		return false
	}
	c := r.RelieveMemory(want)
	if c.empty() {
		return false
	}
	e.kvCompletions(c)
	return true
}

// reliefStep is how many blocks one relief frees at least: an eighth of
// the pool, so a burst of new requests does not evict every held
// conversation at the first shortage.
func (e *Engine) reliefStep() int { return max(1, e.pool.NumBlocks()/8) }

// step runs one schedule → connector → model → sample → update round.
func (e *Engine) step() {
	out := e.sched.Schedule()
	now := e.clock.Now()
	e.noteAdmissions(now)
	e.finish(out.Finished, now)
	if e.cfg.KVWorker != nil {
		c, err := e.cfg.KVWorker.Step(out.ConnectorMeta)
		if err != nil {
			e.log.Error("kv connector worker step failed", "err", err)
		}
		if !c.empty() {
			e.kvCompletions(c)
		}
	}
	if e.m != nil {
		e.m.NumPreemptions.Add(float64(len(out.Preempted)))
	}
	if len(out.Preempted) > 0 || e.sched.ShortOfBlocks() {
		e.relieveMemory(e.reliefStep())
	}

	// Requests a failed synchronous load just voided stay out of the batch.
	batch := out.Scheduled[:0:0]
	e.seqs = e.seqs[:0]
	for _, sc := range out.Scheduled {
		if sc.Req.Status() != sched.Running || sc.Req.Discarded() {
			continue
		}
		if rs := e.reqs[sc.Req.ID]; rs != nil && !rs.scheduled {
			rs.scheduled = true
			if rs.admitted.IsZero() {
				rs.admitted = now
			}
			rs.started = now
			e.fetchStages(rs, now) // an asynchronous load ended before this step
			if rs.loaded.IsZero() && sc.Req.NumExternalTokens() > 0 {
				rs.loaded = e.clock.Now() // a synchronous load, done in the worker's Step above
			}
			if e.m != nil {
				e.m.QueueTime.Observe(now.Sub(rs.arrival).Seconds())
			}
		}
		seq := model.Seq{Tokens: sc.Tokens, Pos: sc.Pos, Blocks: sc.Blocks, Tables: sc.Tables, Prompt: sc.Req.Prompt, Output: sc.Req.Output()}
		if sc.Sample {
			seq.Logits = []int{len(sc.Tokens) - 1}
		}
		batch = append(batch, sc)
		e.seqs = append(e.seqs, seq)
	}
	var results []sched.Result
	if len(batch) > 0 {
		logits, err := e.model.Forward(e.seqs, e.pool.Data(), e.layout)
		now = e.clock.Now()
		if b, l, partial := e.failSeqs(batch, logits, err); partial {
			batch, logits, err = b, l, nil
		}
		if err != nil {
			e.log.Error("model forward failed", "err", err, "batch", len(batch))
			for _, sc := range batch {
				e.sched.Fail(sc.Req.ID, fmt.Sprintf("model forward failed: %v", err))
			}
		} else {
			results = e.sampleAll(batch, logits, now)
		}
	}
	e.finish(e.sched.Update(out, results), now)
	e.publishStats()
}

// noteAdmissions stamps the admission time of requests with kv params that
// the scheduler has taken out of the plain waiting state (into a KV load,
// or a batch): for Timing's queue and KV load phases.
func (e *Engine) noteAdmissions(now time.Time) {
	left := e.unadmitted[:0]
	for _, rs := range e.unadmitted {
		switch {
		case e.reqs[rs.id] != rs: // finished
		case rs.sr.Status() == sched.Waiting:
			left = append(left, rs)
		default:
			rs.admitted = now
		}
	}
	clear(e.unadmitted[len(left):])
	e.unadmitted = left
}
