package kvxfer

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestProducerShutdownAcksTheLastDone: an engine's drain shuts the side
// channel down as soon as the last lease is released, which a DONE does
// before its ACK is written. The ACK must still reach the consumer (Close
// would cut the connection under it, and the decode would log a failed
// DONE for a pull that worked).
func TestProducerShutdownAcksTheLastDone(t *testing.T) {
	base := runtime.NumGoroutine()
	var r *rig
	var once sync.Once
	shut := make(chan error, 1)
	r = newRig(t, rigOpts{prodMut: func(c *ProducerConfig) {
		c.OnRelease = func() {
			once.Do(func() {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					shut <- r.prod.Shutdown(ctx)
				}()
				// Let Shutdown close what it closes before the ACK goes out.
				time.Sleep(50 * time.Millisecond)
			})
		}
	}})
	r.hold(t, "a", 1, 2)
	if err := r.cons.Notify(ctxT(t), r.peer, "a"); err != nil {
		t.Fatalf("DONE during the producer's shutdown: %v, want its ACK", err)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after its last request was answered")
	}
	if _, err := net.DialTimeout("tcp", r.ln.Addr().String(), time.Second); err == nil {
		t.Error("the side channel still accepts connections after Shutdown")
	}
	r.close(t)
	checkNoLeak(t, base)
}

// gatedMemory blocks the producer's read of one block until open is
// closed, so that a READ is on the wire when the test wants it.
type gatedMemory struct {
	*testPool
	victim  int
	entered chan struct{}
	open    chan struct{}
	once    *sync.Once
}

func (m gatedMemory) Block(id int) []byte {
	if id == m.victim {
		m.once.Do(func() { close(m.entered) })
		<-m.open
	}
	return m.testPool.Block(id)
}

// TestProducerShutdownLetsAReadFinish: Shutdown closes idle and
// unauthenticated connections at once, accepts no new one, and lets a READ
// in progress finish with all its bytes before it returns.
func TestProducerShutdownLetsAReadFinish(t *testing.T) {
	base := runtime.NumGoroutine()
	gm := gatedMemory{victim: 3, entered: make(chan struct{}), open: make(chan struct{}), once: &sync.Once{}}
	r := newRig(t, rigOpts{transport: TransportTCP, wrapMem: func(p *testPool) BlockMemory { gm.testPool = p; return gm }})
	silent, err := net.Dial("tcp", r.ln.Addr().String()) // never says HELLO
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	r.hold(t, "a", 2, 3)
	dst := newLocalBlocks(2, tiny.BlockBytes)
	pulled := make(chan error, 1)
	go func() { pulled <- r.cons.Pull(ctxT(t), r.params("a", 2, 3), dst) }()
	select {
	case <-gm.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the READ never reached the producer")
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- r.prod.Shutdown(ctx)
	}()
	silent.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := silent.Read(make([]byte, 64)); err == nil || isTimeout(err) {
		t.Errorf("an unauthenticated connection was not closed by Shutdown (read: %v)", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a READ still on the wire", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gm.open)
	if err := <-pulled; err != nil {
		t.Fatalf("a READ in progress when Shutdown began: %v, want it to finish", err)
	}
	checkBlocks(t, r.pool, []int{2, 3}, dst)
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return once the READ was answered")
	}
	r.close(t)
	checkNoLeak(t, base)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
