package kvxfer

import (
	"fmt"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

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
		memNet := testutil.NewMemNet()
		ln := memNet.Listen()
		served := make(chan error, 1)
		go func() { served <- prod.Serve(ln) }()
		ci := tiny
		ci.EngineID = "d"
		cons, err := NewConsumer(ConsumerConfig{Local: ci, Dial: memNet.Dial, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		peer := Peer{EngineID: "p", Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}

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

// TestHeartbeatOfThousandsOfRequestsFitsTheFrameLimit: one HEARTBEAT used
// to carry every watched id, so past a few thousand queued requests it
// exceeded MaxControlPayload and every lease expired together.
func TestHeartbeatOfThousandsOfRequestsFitsTheFrameLimit(t *testing.T) {
	clk := testutil.NewFakeClock(time.Unix(1000, 0))
	r := newRig(t, rigOpts{prodMut: func(pc *ProducerConfig) { pc.Clock = clk; pc.Lease = 30 * time.Second }})
	const n = 4000
	ids := make([]string, n)
	total := 0
	for i := range ids {
		ids[i] = fmt.Sprintf("%0300d", i) // 4000 × 302 B ≈ 1.2 MB of ids
		total += 2 + len(ids[i])
		if err := r.prod.Hold(ids[i], []int{1}, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if total <= MaxControlPayload {
		t.Fatalf("test ids are %d bytes, not beyond the %d-byte frame limit", total, MaxControlPayload)
	}
	clk.Advance(25 * time.Second)
	p, err := r.cons.peerFor(r.peer)
	if err != nil {
		t.Fatal(err)
	}
	r.cons.wg.Add(1)
	r.cons.sendHeartbeat(p, r.peer, ids)
	r.prod.mu.Lock()
	defer r.prod.mu.Unlock()
	for _, id := range ids {
		if l := r.prod.leases.held[id]; l == nil || !l.expiry.Equal(clk.Now().Add(20*time.Second)) {
			t.Fatalf("request %s… was not extended by the heartbeat", id[290:])
		}
	}
}

func TestHeartbeatChunks(t *testing.T) {
	ids := []string{"aaaa", "bb", "cccccc", "d"}
	got := heartbeatChunks(ids, 4+6+4)
	want := [][]string{{"aaaa", "bb"}, {"cccccc"}, {"d"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("chunks %q, want %q", got, want)
	}
	if got := heartbeatChunks([]string{"a-very-long-id"}, 8); len(got) != 1 {
		t.Fatalf("an id longer than the limit must still go, alone: %q", got)
	}
}
