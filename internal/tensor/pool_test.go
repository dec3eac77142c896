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
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				p.Parallel(10, func(lo, hi int) {
					p.Parallel(hi-lo, func(a, b int) { total.Add(int64(b - a)) })
				})
			}
		}()
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
