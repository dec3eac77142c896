package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestParallelCoversEachIndexOnce(t *testing.T) {
	for _, threads := range []int{0, 1, 2, 3, 8} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 2, 3, 7, 100, 1001} {
			hits := make([]atomic.Int32, n)
			var calls atomic.Int32
			p.Parallel(n, func(lo, hi int) {
				calls.Add(1)
				if lo >= hi {
					t.Errorf("threads=%d n=%d: empty range [%d,%d)", threads, n, lo, hi)
				}
				for i := lo; i < hi; i++ {
					hits[i].Add(1)
				}
			})
			for i := range hits {
				if hits[i].Load() != 1 {
					t.Fatalf("threads=%d n=%d: index %d ran %d times", threads, n, i, hits[i].Load())
				}
			}
			if int(calls.Load()) > p.Threads() {
				t.Fatalf("threads=%d n=%d: %d ranges, want at most %d", threads, n, calls.Load(), p.Threads())
			}
		}
		p.Close()
	}
}

func TestParallelSurvivesNestedAndConcurrentCalls(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	var total atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				p.Parallel(10, func(lo, hi int) {
					p.Parallel(hi-lo, func(a, b int) { total.Add(int64(b - a)) })
				})
			}
		})
	}
	wg.Wait()
	if got := total.Load(); got != 4*200*10 {
		t.Fatalf("ran %d indices, want %d", got, 4*200*10)
	}
}

func TestPoolWorksAfterClose(t *testing.T) {
	p := NewPool(2)
	p.Parallel(4, func(lo, hi int) {})
	p.Close()
	p.Close()
	var n atomic.Int32
	p.Parallel(5, func(lo, hi int) { n.Add(int32(hi - lo)) })
	if n.Load() != 5 {
		t.Fatalf("after Close, Parallel ran %d of 5 indices", n.Load())
	}
}

func TestPoolWakesParkedWorkers(t *testing.T) {
	// Workers park after spinFor; a later job must wake them. The caller's
	// chunk waits until worker 1 has joined, so a lost wake-up fails here.
	p := NewPool(2)
	defer p.Close()
	for i := range 3 {
		if i > 0 {
			waitParked(t, p)
		}
		var joined atomic.Bool
		p.run(2, 1, func(part, lo, hi int) {
			if part == 1 {
				joined.Store(true)
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for !joined.Load() && time.Now().Before(deadline) {
				runtime.Gosched()
			}
		})
		if !joined.Load() {
			t.Fatalf("round %d: worker 1 never joined the job", i)
		}
	}
}

// waitParked waits until every worker of p has parked.
func waitParked(t *testing.T, p *Pool) {
	t.Helper()
	for range 100000 {
		all := true
		for _, w := range p.workers {
			all = all && w.sleeping.Load()
		}
		if all {
			return
		}
		spinMicro()
	}
	t.Fatal("workers never parked")
}

// spinMicro burns roughly tens of microseconds of CPU.
func spinMicro() {
	x := 1.0
	for range 20000 {
		x = x*1.0000001 + 1e-9
	}
	sink.Store(int64(x))
}

var sink atomic.Int64

// TestPoolStress runs many pools at once (more workers than GOMAXPROCS),
// each hammered with tiny jobs from several goroutines, including nested
// calls, while pools are closed concurrently with their use. Workers
// alternate between spinning and parking throughout, which is where a
// lost wake-up or a wait on a chunk nobody runs would hang. Run it with
// -race and -count.
func TestPoolStress(t *testing.T) {
	const pools, callers, calls = 12, 3, 1000
	var wg sync.WaitGroup
	for pi := range pools {
		p := NewPool(2 + pi%3)
		var users sync.WaitGroup
		for ci := range callers {
			users.Add(1)
			wg.Go(func() {
				defer users.Done()
				for i := range calls {
					n := 1 + (i*7+ci)%9
					var got atomic.Int64
					p.Parallel(n, func(lo, hi int) {
						if i%5 == 0 {
							p.Parallel(hi-lo, func(a, b int) { got.Add(int64(b - a)) })
						} else {
							got.Add(int64(hi - lo))
						}
					})
					if got.Load() != int64(n) {
						t.Errorf("pool %d: Parallel(%d) ran %d indices", pi, n, got.Load())
						return
					}
					if i%50 == 49 {
						// Let the workers park so the next call must wake them.
						time.Sleep(2 * spinFor)
					}
				}
			})
		}
		wg.Go(func() {
			if pi%2 == 0 {
				users.Wait() // close when idle ...
			} else {
				time.Sleep(time.Duration(pi) * time.Millisecond) // ... or mid-use
			}
			p.Close()
			p.Close()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("pool stress hung; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

// TestPoolWorkerPanicReachesCaller checks that a panic in a callback, on
// a worker or on the caller, reaches the calling goroutine after the job
// is over (instead of killing the process from a worker, or leaving the
// caller waiting for its own abandoned chunk), and that the pool keeps
// working afterwards.
func TestPoolWorkerPanicReachesCaller(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for range 20 {
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Fatalf("recovered %v, want boom", v)
				}
			}()
			// Every chunk panics, so the caller, the worker or both raise.
			p.run(2, 1, func(part, lo, hi int) { panic("boom") })
			t.Fatal("run returned normally after a panic")
		}()
		var n atomic.Int32
		p.Parallel(4, func(lo, hi int) { n.Add(int32(hi - lo)) })
		if n.Load() != 4 {
			t.Fatalf("after a panic, Parallel ran %d of 4 indices", n.Load())
		}
	}
}

// TestPoolWorkerGoexit is the hang a t.FailNow inside a callback used to
// cause: the worker goroutine exited mid-chunk and the caller waited for
// that chunk forever. Now the chunk counts as done and the worker is
// replaced.
func TestPoolWorkerGoexit(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for range 5 {
		var ran atomic.Int32
		p.run(4, 1, func(part, lo, hi int) {
			ran.Add(1)
			if part == 1 {
				runtime.Goexit()
			}
		})
		var joined atomic.Bool
		p.run(2, 1, func(part, lo, hi int) {
			if part == 1 {
				joined.Store(true)
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for !joined.Load() && time.Now().Before(deadline) {
				runtime.Gosched()
			}
		})
		if !joined.Load() {
			t.Fatal("no worker joined after another exited")
		}
	}
}
