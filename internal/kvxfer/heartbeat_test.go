package kvxfer

import (
	"context"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener is an in-memory listener: inside a synctest bubble its
// connections block durably, so fake time advances while they wait.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5600} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	a, b := net.Pipe()
	select {
	case l.conns <- b:
		return a, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestHeartbeatsKeepLeasesAlive runs a producer, a consumer and a fake
// step loop in fake time: a watched request outlives its 30 s lease for as
// long as it is watched, and expires one extension after Unwatch.
func TestHeartbeatsKeepLeasesAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := newMemPool(4, tiny.BlockBytes)
		pi := tiny
		pi.EngineID = "p"
		prod, err := NewProducer(ProducerConfig{Local: pi, Memory: mem, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ln := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- prod.Serve(ln) }()
		ci := tiny
		ci.EngineID = "d"
		cons, err := NewConsumer(ConsumerConfig{Local: ci, Dial: ln.dial, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		peer := Peer{EngineID: "p", Host: "127.0.0.1", Port: 5600}

		start := time.Now()
		if err := prod.Hold("watched", []int{0, 1}, start); err != nil {
			t.Fatal(err)
		}
		if err := prod.Hold("forgotten", []int{2}, start); err != nil {
			t.Fatal(err)
		}
		cons.Watch(peer, "watched")

		// The step loop: sweep every 100 ms, record when each request was
		// released.
		releasedAt := map[string]time.Duration{}
		stepLoop := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
				time.Sleep(100 * time.Millisecond)
				prod.Sweep(time.Now())
				for _, r := range prod.TakeReleased() {
					if r.Reason != ReleasedExpired {
						t.Errorf("%s released as %s", r.RequestID, r.Reason)
					}
					releasedAt[r.RequestID] = time.Since(start)
				}
				synctest.Wait()
			}
		}
		stepLoop(2 * time.Minute)
		if got, ok := releasedAt["forgotten"]; !ok || got < 30*time.Second || got > 30*time.Second+100*time.Millisecond {
			t.Fatalf("unwatched request released at %v (ok=%v), want at 30 s", got, ok)
		}
		if got, ok := releasedAt["watched"]; ok {
			t.Fatalf("watched request released at %v despite heartbeats", got)
		}

		cons.Unwatch(peer, "watched")
		stopped := time.Since(start)
		stepLoop(time.Minute)
		got, ok := releasedAt["watched"]
		// The last heartbeat was at most one interval (5 s) before
		// Unwatch and extended the lease by 20 s.
		if !ok || got < stopped+15*time.Second || got > stopped+20*time.Second+200*time.Millisecond {
			t.Fatalf("watched request released at %v (ok=%v) after Unwatch at %v, want 15–20 s later", got, ok, stopped)
		}
		if n := prod.HeldBlocks(); n != 0 {
			t.Fatalf("%d blocks still held", n)
		}
		cons.Close()
		prod.Close()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	})
}

// memPool is a BlockMemory in ordinary memory (no shared file).
type memPool struct {
	blocks [][]byte
	gens   []uint64
}

func newMemPool(n, bb int) *memPool {
	return &memPool{blocks: newLocalBlocks(n, bb), gens: make([]uint64, n)}
}

func (m *memPool) NumBlocks() int           { return len(m.blocks) }
func (m *memPool) BlockBytes() int          { return len(m.blocks[0]) }
func (m *memPool) Block(id int) []byte      { return m.blocks[id] }
func (m *memPool) Generation(id int) uint64 { return m.gens[id] }
