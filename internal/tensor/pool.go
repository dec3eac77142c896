package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// spinFor is how long an idle worker polls for the next job before it parks.
// The engine's step loop issues kernels back to back with a few microseconds
// of serial work between them; polling across those gaps saves the
// futex wake-up (several microseconds) that parking would cost on each call.
const spinFor = 100 * time.Microsecond

// Pool is a persistent set of worker goroutines that run data-parallel
// kernels. Workers live as long as the pool; an idle worker polls briefly
// for the next job and then parks until it is woken, so a call costs no
// goroutine creation and, in a busy step loop, no wake-up either. The
// calling goroutine always takes a share of the work.
//
// Parallel and MatMul are meant to be called from one goroutine at a time
// (the engine's step loop). They are nevertheless safe to misuse: a call
// made while another call is running on the same pool — from a second
// goroutine, or from inside a Parallel callback — runs entirely on its
// calling goroutine instead of deadlocking or racing. Results do not depend
// on which path ran, because no kernel's output depends on how work is
// split.
type Pool struct {
	threads int
	busy    sync.Mutex // held by the goroutine running a parallel job

	cur     atomic.Pointer[job] // the latest job; workers run each job once
	workers []*worker
	wg      sync.WaitGroup
	closed  atomic.Bool
}

// worker is the parking state of one worker goroutine.
type worker struct {
	sleeping atomic.Bool
	wake     chan struct{} // capacity 1: at most one pending wake-up
}

// job is one call of Parallel. A fresh job is published per call so a late
// worker can never confuse an old job with a new one.
type job struct {
	fn      func(part, lo, hi int)
	n       int
	chunk   int
	nchunks int64
	next    atomic.Int64 // next chunk to claim
	done    atomic.Int64 // chunks finished, skipped or abandoned
	quit    bool         // tells workers to exit

	// panicked holds the first panic a worker's chunk raised; the caller
	// re-raises it once the job is over.
	panicked atomic.Pointer[workerPanic]
}

// workerPanic carries a panic value from a worker to the caller.
type workerPanic struct{ v any }

// NewPool starts a pool that runs kernels on threads goroutines: the caller
// plus threads-1 workers. threads below 1 is treated as 1.
func NewPool(threads int) *Pool {
	threads = max(threads, 1)
	p := &Pool{threads: threads}
	first := &job{}
	p.cur.Store(first)
	for id := 1; id < threads; id++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.work(id, w, first)
	}
	return p
}

// Threads reports the pool's parallelism (the caller included).
func (p *Pool) Threads() int { return p.threads }

// Close stops the workers and waits for them to exit. After Close, calls
// still work but run on the calling goroutine only. Close is idempotent.
func (p *Pool) Close() {
	p.busy.Lock()
	defer p.busy.Unlock()
	if p.closed.Swap(true) {
		return
	}
	p.publish(&job{quit: true})
	p.wg.Wait()
}

// Parallel splits [0,n) into contiguous ranges and runs fn on them across
// the pool, returning when all are done. The ranges are disjoint, cover
// [0,n) and each is passed to exactly one call of fn; there are at most
// Threads ranges. fn must not assume which goroutine runs it.
func (p *Pool) Parallel(n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	chunk := (n + p.threads - 1) / p.threads
	p.run(n, chunk, func(_, lo, hi int) { fn(lo, hi) })
}

// ParallelChunks is Parallel with ranges of at most chunk items, claimed
// dynamically by whichever participant is free: for items of uneven cost.
func (p *Pool) ParallelChunks(n, chunk int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	p.run(n, chunk, func(_, lo, hi int) { fn(lo, hi) })
}

// run calls fn(part, lo, hi) over chunks of [0,n) of size chunk (the last
// may be shorter). Participants claim chunks dynamically, so a participant
// that is descheduled does not hold the others up. part identifies the
// participant (0 is the caller, less than Threads; -1 when the call runs
// outside the pool because the pool was busy) and is stable for the
// duration of one fn call, so fn may index per-participant state with it.
func (p *Pool) run(n, chunk int, fn func(part, lo, hi int)) {
	if n <= 0 {
		return
	}
	chunk = max(chunk, 1)
	if !p.busy.TryLock() {
		// A concurrent or nested call: run alone, without pool scratch.
		fn(-1, 0, n)
		return
	}
	defer p.busy.Unlock()
	if p.threads == 1 || chunk >= n || p.closed.Load() {
		fn(0, 0, n)
		return
	}
	j := &job{fn: fn, n: n, chunk: chunk, nchunks: int64((n + chunk - 1) / chunk)}
	p.publish(j)
	// If fn panics (or calls runtime.Goexit) on this goroutine, the
	// deferred finish still waits for the chunks workers hold, so nobody
	// is left writing into the caller's buffers after run returns.
	inChunk := false
	defer func() { j.finish(inChunk) }()
	for {
		c := j.next.Add(1) - 1
		if c >= j.nchunks {
			break
		}
		lo := int(c) * j.chunk
		inChunk = true
		fn(0, lo, min(lo+j.chunk, n))
		inChunk = false
		j.done.Add(1)
	}
}

// finish counts the caller's own unfinished chunk (inChunk: it is
// unwinding from fn) and the chunks nobody has claimed (only possible when
// unwinding) as done, waits for the chunks workers hold and re-raises a
// worker's panic on the caller. Workers count a chunk as done even when fn
// panics or exits the goroutine, so this wait always ends.
func (j *job) finish(inChunk bool) {
	if inChunk {
		j.done.Add(1)
	}
	for j.next.Add(1)-1 < j.nchunks {
		j.done.Add(1)
	}
	for spins := 0; j.done.Load() != j.nchunks; spins++ {
		if spins >= 64 {
			// A worker holding a chunk may need this thread's P.
			runtime.Gosched()
		}
	}
	if wp := j.panicked.Load(); wp != nil {
		panic(wp.v)
	}
}

// publish makes j the current job and wakes parked workers.
func (p *Pool) publish(j *job) {
	p.cur.Store(j)
	for _, w := range p.workers {
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
}

// runChunks claims and runs chunks of j on a worker until none are left.
func (j *job) runChunks(part int) {
	for {
		c := j.next.Add(1) - 1
		if c >= j.nchunks {
			return
		}
		lo := int(c) * j.chunk
		j.runChunk(part, lo, min(lo+j.chunk, j.n))
	}
}

// runChunk runs one chunk on a worker. A panic is recovered and handed to
// the caller (it would otherwise kill the process from a goroutine nobody
// can recover on); done is counted however fn ends.
func (j *job) runChunk(part, lo, hi int) {
	defer func() {
		if v := recover(); v != nil {
			j.panicked.CompareAndSwap(nil, &workerPanic{v: v})
		}
		j.done.Add(1)
	}()
	j.fn(part, lo, hi)
}

// work is the loop of worker goroutine id. last is the job that was
// current when the worker was created: every later job is new to it.
func (p *Pool) work(id int, w *worker, last *job) {
	exited := true
	defer func() {
		if exited {
			// fn called runtime.Goexit on this goroutine (t.FailNow in a
			// test callback). Keep the pool at full strength.
			p.wg.Add(1)
			go p.work(id, w, last)
		}
		p.wg.Done()
	}()
	for {
		j := p.await(w, last)
		if j.quit {
			exited = false
			return
		}
		last = j
		j.runChunks(id)
	}
}

// await returns the next job after last: it polls for spinFor, then parks.
// The sleeping flag and the job pointer form a Dekker pair with publish:
// either the worker sees the new job after raising its flag, or publish
// sees the flag and sends a wake-up.
func (p *Pool) await(w *worker, last *job) *job {
	start := time.Now()
	for spins := 1; ; spins++ {
		if j := p.cur.Load(); j != last {
			return j
		}
		if spins%64 != 0 {
			continue
		}
		runtime.Gosched() // lets the caller run if it shares this P
		if time.Since(start) < spinFor {
			continue
		}
		w.sleeping.Store(true)
		if j := p.cur.Load(); j != last {
			if !w.sleeping.CompareAndSwap(true, false) {
				<-w.wake // publish already sent a wake-up; consume it
			}
			return j
		}
		<-w.wake
		start = time.Now()
	}
}
