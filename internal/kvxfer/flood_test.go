package kvxfer

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// flood dials the side channel at addr from 127.0.0.1 (the address every
// co-located decode shares) until stop closes: silent connections, ones
// that dribble garbage, and ones that send a valid HELLO and then stall.
// Each attacker dials again shortly after the producer drops it, so the
// handshake slots stay under pressure for the whole test.
type flood struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	open map[net.Conn]struct{}
}

func startFlood(addr string, silent, garbage, stalled int) *flood {
	f := &flood{stop: make(chan struct{}), open: make(map[net.Conn]struct{})}
	run := func(behave func(net.Conn)) {
		f.wg.Go(func() {
			for {
				select {
				case <-f.stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					continue
				}
				f.mu.Lock()
				f.open[c] = struct{}{}
				f.mu.Unlock()
				behave(c)
				f.mu.Lock()
				delete(f.open, c)
				f.mu.Unlock()
				c.Close()
				// Pace the redial a little, so the test measures the
				// producer's policy rather than a CPU race.
				select {
				case <-f.stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
	}
	for range silent {
		run(func(c net.Conn) { io.Copy(io.Discard, c) })
	}
	for range garbage {
		run(func(c net.Conn) {
			// Bytes that are not a frame, one every 100 ms.
			go io.Copy(io.Discard, c)
			for i := 0; ; i++ {
				if _, err := c.Write([]byte{byte('G' + i%7)}); err != nil {
					return
				}
				select {
				case <-f.stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	for range stalled {
		run(func(c net.Conn) {
			nd := make([]byte, nonceSize)
			rand.Read(nd)
			c.Write(frame(msgHello, 1, func(b []byte) []byte { return append(b, nd...) }))
			io.Copy(io.Discard, c) // CHALLENGE, then nothing until dropped
		})
	}
	return f
}

func (f *flood) close() {
	close(f.stop)
	f.mu.Lock()
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// TestHandshakeFloodFromTheDecodesAddressCannotStarvePulls: a flood of
// connections that never authenticate, from the very address the decode
// engines use (127.0.0.1, shared by every co-located engine), must not make
// real pulls fail: each new decode (a fresh handshake) pulls within its
// deadline while the flood goes on.
func TestHandshakeFloodFromTheDecodesAddressCannotStarvePulls(t *testing.T) {
	server, client := testTLS(t)
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "tcp", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			var prodMut func(*ProducerConfig)
			var clientTLS *tls.Config
			if withTLS {
				prodMut = func(pc *ProducerConfig) { pc.TLS = server }
				clientTLS = client
			}
			testFlood(t, newRig(t, rigOpts{transport: TransportTCP, prodMut: prodMut}), clientTLS)
		})
	}
}

func testFlood(t *testing.T, r *rig, clientTLS *tls.Config) {
	f := startFlood(r.ln.Addr().String(), 2*DefaultMaxPendingPerHost, 8, 8)
	defer f.close()

	// Wait until the flood holds every handshake slot of 127.0.0.1.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.prod.mu.Lock()
		n := r.prod.pendingBy["127.0.0.1"]
		r.prod.mu.Unlock()
		if n >= DefaultMaxPendingPerHost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood holds %d handshake slots after 5s, want %d", n, DefaultMaxPendingPerHost)
		}
		time.Sleep(5 * time.Millisecond)
	}

	const rounds, perRound = 6, 3
	var failed []string
	for round := range rounds {
		// A new decode engine each round, so each round handshakes anew;
		// concurrent pulls each dial a connection of their own.
		ci := tiny
		ci.EngineID = fmt.Sprintf("decode-flood-%d", round)
		cons, err := NewConsumer(ConsumerConfig{Local: ci, Transport: TransportTCP, Secret: testSecret, TLS: clientTLS, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, perRound)
		for i := range perRound {
			req := fmt.Sprintf("flood-%d-%d", round, i)
			block := (round*perRound + i) % r.pool.n
			r.hold(t, req, block)
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
				defer cancel()
				dst := newLocalBlocks(1, tiny.BlockBytes)
				if errs[i] = cons.Pull(ctx, r.params(req, block), dst); errs[i] == nil {
					checkBlocks(t, r.pool, []int{block}, dst)
				}
			})
		}
		wg.Wait()
		cons.Close()
		for i, err := range errs {
			if err != nil {
				failed = append(failed, fmt.Sprintf("round %d pull %d: %v", round, i, err))
			}
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d pulls failed under an unauthenticated flood from their own address:", len(failed), rounds*perRound)
		for _, f := range failed {
			t.Log(f)
		}
	}
}

// TestGarbageIsDroppedAtItsFirstByte: a connection whose first byte cannot
// open a frame (or, under TLS, a TLS record) is closed when that byte
// arrives, not at the hello deadline.
func TestGarbageIsDroppedAtItsFirstByte(t *testing.T) {
	server, _ := testTLS(t)
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "tcp", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) {
				pc.HelloTimeout, pc.AuthTimeout = 10*time.Second, 10*time.Second
				if withTLS {
					pc.TLS = server
				}
			}})
			c, err := net.Dial("tcp", r.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte("G")) // and nothing more
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil && !isStale(err) {
				t.Fatalf("one garbage byte kept the connection open: %v", err)
			}
		})
	}
}

// TestAuthenticatedSlotsAreSharedFairlyByEngine: once a consumer engine
// holds MaxConnsPerPeer connections, its next one is refused as busy, and
// another engine from the same address still gets a connection and pulls.
func TestAuthenticatedSlotsAreSharedFairlyByEngine(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP, prodMut: func(pc *ProducerConfig) {
		pc.MaxConns, pc.MaxConnsPerPeer = 8, 2
	}})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 3 {
		c, err := net.Dial("tcp", r.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, err = rawClientHandshake(t, c, testSecret) // engine id "raw-client"
		if i < 2 && err != nil {
			t.Fatalf("connection %d of raw-client: %v", i, err)
		}
		if i == 2 {
			var re *RemoteError
			if !errors.As(err, &re) || re.Code != CodeBusy || !strings.Contains(re.Message, "raw-client") {
				t.Fatalf("third connection of raw-client: got %v, want ERROR busy naming raw-client", err)
			}
		}
	}
	r.hold(t, "fair", 1)
	dst := newLocalBlocks(1, tiny.BlockBytes)
	if err := r.cons.Pull(ctxT(t), r.params("fair", 1), dst); err != nil {
		t.Fatalf("decode-1 could not pull while raw-client holds its share: %v", err)
	}
	checkBlocks(t, r.pool, []int{1}, dst)
}
