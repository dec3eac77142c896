package kvxfer

import (
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// fillPool checks out n connections to r's producer at once and returns
// them to the pool, so that n are idle there.
func fillPool(t *testing.T, r *rig, n int) {
	t.Helper()
	type taken struct {
		p  *peerState
		cn *pconn
	}
	var all []taken
	for range n {
		p, cn, _, err := r.cons.acquire(ctxT(t), r.peer, true)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, taken{p, cn})
	}
	for _, c := range all {
		r.cons.putConn(c.p, c.cn, nil)
	}
}

func idleConns(r *rig) int {
	p, _ := r.cons.peerFor(r.peer)
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// TestPooledConnectionsTheProducerClosedAreNotReused: every pooled
// connection outlived the producer's idle timeout (the consumer's is
// longer, as a misconfigured pair would have it): the pull on the first
// one fails as stale and is retried on a newly dialed connection, not on
// another of the dead pooled ones (which failed a P/D experiment's pull
// with "broken pipe" before), and those are dropped.
func TestPooledConnectionsTheProducerClosedAreNotReused(t *testing.T) {
	for _, tr := range []Transport{TransportTCP, TransportShm} {
		t.Run(string(tr), func(t *testing.T) {
			r := newRig(t, rigOpts{transport: tr,
				prodMut: func(c *ProducerConfig) { c.IdleTimeout = 100 * time.Millisecond },
				consMut: func(c *ConsumerConfig) { c.IdleConnTimeout = time.Hour; c.MaxIdleConns = 4 },
			})
			fillPool(t, r, 4)
			if n := idleConns(r); n != 4 {
				t.Fatalf("%d idle connections, want 4", n)
			}
			testutil.WaitFor(t, "the producer to close all four", 10*time.Second, func() bool {
				r.prod.mu.Lock()
				defer r.prod.mu.Unlock()
				return len(r.prod.conns) == 0
			})
			r.hold(t, "req-a", 2, 3)
			dst := newLocalBlocks(2, tiny.BlockBytes)
			if err := r.cons.Pull(ctxT(t), r.params("req-a", 2, 3), dst); err != nil {
				t.Fatalf("pull after the producer closed the pooled connections: %v", err)
			}
			checkBlocks(t, r.pool, []int{2, 3}, dst)
			if n := idleConns(r); n != 1 {
				t.Errorf("%d idle connections after the pull, want 1 (the new one; the dead ones dropped)", n)
			}
		})
	}
}

// TestPooledConnectionsExpireBeforeTheProducersTimeout: a connection idle
// longer than the consumer's IdleConnTimeout is closed rather than used,
// so the default (a minute) keeps clear of the producer's (five).
func TestPooledConnectionsExpireBeforeTheProducersTimeout(t *testing.T) {
	if DefaultIdleConnTimeout >= DefaultIdleTimeout {
		t.Fatalf("DefaultIdleConnTimeout %v is not below the producer's DefaultIdleTimeout %v", DefaultIdleConnTimeout, DefaultIdleTimeout)
	}
	r := newRig(t, rigOpts{transport: TransportTCP,
		consMut: func(c *ConsumerConfig) { c.IdleConnTimeout = 100 * time.Millisecond; c.MaxIdleConns = 4 },
	})
	fillPool(t, r, 3)
	var stale []*pconn
	p, _ := r.cons.peerFor(r.peer)
	p.mu.Lock()
	stale = append(stale, p.idle...)
	p.mu.Unlock()
	time.Sleep(200 * time.Millisecond)
	r.hold(t, "req-a", 1)
	dst := newLocalBlocks(1, tiny.BlockBytes)
	if err := r.cons.Pull(ctxT(t), r.params("req-a", 1), dst); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) != 1 {
		t.Fatalf("%d idle connections, want the new one only", len(p.idle))
	}
	for _, cn := range stale {
		if cn == p.idle[0] {
			t.Error("an expired connection was reused")
		}
	}
}
