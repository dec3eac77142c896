package kvxfer

import (
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestIdleAndSlowConnectionsCannotStarveRealPulls: 300 silent connections
// and a slow loris from one address take at most that address's pending
// slots; each is dropped by the handshake deadline, refusals cost no
// goroutine, and pulls from another address keep succeeding meanwhile.
func TestIdleAndSlowConnectionsCannotStarveRealPulls(t *testing.T) {
	const authTimeout = 500 * time.Millisecond
	r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) { pc.AuthTimeout = authTimeout }})
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: time.Second}
	base := runtime.NumGoroutine()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 300 {
		c, err := attacker.Dial("tcp", r.ln.Addr().String())
		if err != nil {
			t.Fatalf("dial from 127.0.0.2: %v", err)
		}
		conns = append(conns, c)
	}
	// A slow loris: a valid header's first bytes, one every 100 ms.
	loris, err := attacker.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, loris)
	lorisDone := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		hello := frame(msgHello, 1, func(b []byte) []byte { return append(b, make([]byte, nonceSize)...) })
		for _, b := range hello {
			if _, err := loris.Write([]byte{b}); err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		lorisDone <- time.Since(start)
	}()

	// A refused connection's goroutine ends at once, but not before the
	// dial returns: count after the refusals have ended and well before the
	// handshake deadline would drop the pending ones too (the count read
	// straight after the dials was 41–244 here, failing 1 run in 3).
	settled := func() bool { return runtime.NumGoroutine()-base <= DefaultMaxPendingPerHost+8 }
	settleBy := time.Now().Add(authTimeout / 2)
	for !settled() && time.Now().Before(settleBy) {
		time.Sleep(5 * time.Millisecond)
	}
	if g := runtime.NumGoroutine() - base; g > DefaultMaxPendingPerHost+8 {
		t.Errorf("%d goroutines for 301 connections from one address, %v after the last dial; pending ones are capped at %d and refusals must cost none", g, authTimeout/2, DefaultMaxPendingPerHost)
	}
	// Real pulls from 127.0.0.1 succeed while the attacker's connections
	// are open.
	for i := range 5 {
		req := "real-" + string(rune('a'+i))
		r.hold(t, req, i+1)
		dst := newLocalBlocks(1, tiny.BlockBytes)
		if err := r.cons.Pull(ctxT(t), r.params(req, i+1), dst); err != nil {
			t.Fatalf("pull %d while under attack: %v", i, err)
		}
		checkBlocks(t, r.pool, []int{i + 1}, dst)
	}
	// Every attacker connection is closed by the producer within the
	// handshake deadline (refused at once, or dropped at the deadline).
	deadline := time.Now().Add(authTimeout + 2*time.Second)
	var wg sync.WaitGroup
	open := make(chan int, len(conns))
	for i, c := range conns[:300] {
		wg.Go(func() {
			c.SetReadDeadline(deadline)
			if _, err := io.Copy(io.Discard, c); err != nil {
				open <- i // a read deadline, not the server's close
			}
		})
	}
	wg.Wait()
	close(open)
	if n := len(open); n > 0 {
		t.Errorf("%d idle connections still open %v after the handshake deadline", n, authTimeout+2*time.Second)
	}
	select {
	case d := <-lorisDone:
		if d > authTimeout+2*time.Second {
			t.Errorf("the slow loris kept its connection for %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Error("the slow loris is still connected")
	}
}

// TestBurstBeyondTheHandshakeSlotsIsRetried: a decode that opens more
// connections at once than the producer lets one address handshake is
// refused for some of them and retries, so every pull succeeds — in
// plaintext (ERROR busy) and under TLS (a bare close).
func TestBurstBeyondTheHandshakeSlotsIsRetried(t *testing.T) {
	server, client := testTLS(t)
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "tcp", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, rigOpts{transport: TransportTCP,
				prodMut: func(pc *ProducerConfig) {
					pc.MaxPendingPerHost = 2
					if withTLS {
						pc.TLS = server
					}
				},
				consMut: func(cc *ConsumerConfig) {
					if withTLS {
						cc.TLS = client
					}
				}})
			const n = 16
			for i := range n {
				r.hold(t, "burst-"+string(rune('a'+i)), i%r.pool.n)
			}
			// After the first (single-flight) handshake, each concurrent
			// pull dials its own connection: n at once from one address.
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					dst := newLocalBlocks(1, tiny.BlockBytes)
					errs <- r.cons.Pull(ctxT(t), r.params("burst-"+string(rune('a'+i)), i%r.pool.n), dst)
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("pull in a burst: %v", err)
				}
			}
		})
	}
}
