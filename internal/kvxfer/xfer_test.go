package kvxfer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

func checkBlocks(t *testing.T, pool *testPool, ids []int, dst [][]byte) {
	t.Helper()
	for i, id := range ids {
		if !bytes.Equal(dst[i], pool.Block(id)) {
			t.Fatalf("destination block %d differs from remote block %d", i, id)
		}
	}
}

func TestPullCopiesBlocksAndFreesThem(t *testing.T) {
	tests := []struct {
		name      string
		transport Transport
		geom      Info
		held      []int
		pull      []int
	}{
		{"tcp pulls every held block in request order", TransportTCP, tiny, []int{5, 1, 9, 3}, []int{5, 1, 9, 3}},
		{"tcp pulls only the un-cached suffix", TransportTCP, tiny, []int{5, 1, 9, 3}, []int{9, 3}},
		{"tcp pulls smollm-sized blocks", TransportTCP, smollm, []int{0, 3, 2}, []int{0, 3, 2}},
		{"shm pulls every held block in request order", TransportShm, tiny, []int{5, 1, 9, 3}, []int{5, 1, 9, 3}},
		{"shm pulls smollm-sized blocks", TransportShm, smollm, []int{0, 3, 2}, []int{0, 3, 2}},
		{"auto picks shm on one host and pulls correctly", TransportAuto, tiny, []int{7}, []int{7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpts{geom: tc.geom, transport: tc.transport, blocks: 12})
			r.hold(t, "req-a", tc.held...)
			dst := newLocalBlocks(len(tc.pull), tc.geom.BlockBytes)
			if err := r.cons.Pull(ctxT(t), r.params("req-a", tc.pull...), dst); err != nil {
				t.Fatal(err)
			}
			checkBlocks(t, r.pool, tc.pull, dst)
			rel := r.prod.TakeReleased()
			if len(rel) != 1 || rel[0].RequestID != "req-a" || rel[0].Reason != ReleasedDone || len(rel[0].Blocks) != len(tc.held) {
				t.Fatalf("released %+v, want req-a with all %d blocks, done", rel, len(tc.held))
			}
			if n := r.prod.HeldBlocks(); n != 0 {
				t.Fatalf("%d blocks still held", n)
			}
			p := r.cons.peers[r.peer.EngineID]
			if gotShm := p.shm != nil; gotShm != (tc.transport != TransportTCP) {
				t.Fatalf("shared memory used = %v with transport %q", gotShm, tc.transport)
			}
		})
	}
}

func TestReadAfterReleaseFailsClearly(t *testing.T) {
	for _, tr := range []Transport{TransportTCP, TransportShm} {
		t.Run(string(tr), func(t *testing.T) {
			r := newRig(t, rigOpts{transport: tr})
			r.hold(t, "req-a", 1, 2)
			dst := newLocalBlocks(2, tiny.BlockBytes)
			if err := r.cons.Pull(ctxT(t), r.params("req-a", 1, 2), dst); err != nil {
				t.Fatal(err)
			}
			err := r.cons.Pull(ctxT(t), r.params("req-a", 1, 2), dst)
			wantErr(t, err, ErrNotHeld, `request "req-a" is not held by engine prefill-1: it was already released`)
			err = r.cons.Pull(ctxT(t), r.params("req-zz", 1), dst[:1])
			wantErr(t, err, ErrNotHeld, "unknown request")
			if FailureReason(err) != "not_held" {
				t.Fatalf("reason %q", FailureReason(err))
			}
		})
	}
}

func TestNotifyFreesWithoutPulling(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.hold(t, "req-a", 3)
	if err := r.cons.Notify(ctxT(t), r.peer, "req-a"); err != nil {
		t.Fatal(err)
	}
	if rel := r.prod.TakeReleased(); len(rel) != 1 || rel[0].Reason != ReleasedDone {
		t.Fatalf("released %+v", rel)
	}
	wantErr(t, r.cons.Notify(ctxT(t), r.peer, "req-a"), ErrNotHeld, "already released")
}

func TestHandshakeMismatchSaysWhatToChange(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*Info)
		want string
	}{
		{"block size", func(i *Info) { i.BlockSize = 32 }, "block size differs: prefill engine prefill-1 has 4, this decode engine has 32 — start both with the same --block-size"},
		{"model", func(i *Info) { i.ModelFingerprint = "other" }, `different models or weights: prefill engine prefill-1 serves model fingerprint "tiny@test", this decode engine serves "other"`},
		{"kv dtype", func(i *Info) { i.KVDType = "bf16" }, "KV dtype differs: prefill engine prefill-1 has f32, this decode engine has bf16 — start both with the same --kv-cache-dtype"},
		{"layers", func(i *Info) { i.Layers = 3 }, "number of layers differs: prefill engine prefill-1 has 2, this decode engine has 3"},
		{"kv heads", func(i *Info) { i.KVHeads = 2 }, "number of KV heads differs: prefill engine prefill-1 has 1, this decode engine has 2"},
		{"head dim", func(i *Info) { i.HeadDim = 16 }, "head dim differs: prefill engine prefill-1 has 8, this decode engine has 16"},
		{"block bytes", func(i *Info) { i.BlockBytes = 128 }, "block bytes differs: prefill engine prefill-1 has 512, this decode engine has 128"},
	}
	for _, tc := range tests {
		t.Run("a different "+tc.name+" is refused", func(t *testing.T) {
			r := newRig(t, rigOpts{consMut: func(c *ConsumerConfig) { tc.mut(&c.Local) }})
			r.hold(t, "req-a", 1)
			dst := newLocalBlocks(1, r.cons.cfg.Local.BlockBytes)
			err := r.cons.Pull(ctxT(t), r.params("req-a", 1), dst)
			wantErr(t, err, ErrIncompatible, tc.want)
			if FailureReason(err) != "incompatible" {
				t.Fatalf("reason %q", FailureReason(err))
			}
		})
	}
}

func TestConcurrentPullsShareOneHandshake(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP, blocks: 64})
	const n = 16
	for i := range n {
		r.hold(t, fmt.Sprint("req-", i), 4*i%64, (4*i+1)%64)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			dst := newLocalBlocks(2, tiny.BlockBytes)
			errs[i] = r.cons.Pull(ctxT(t), r.params(fmt.Sprint("req-", i), 4*i%64, (4*i+1)%64), dst)
			if errs[i] == nil {
				checkBlocks(t, r.pool, []int{4 * i % 64, (4*i + 1) % 64}, dst)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if h := r.cons.firstHandshakes.Load(); h != 1 {
		t.Fatalf("%d first handshakes with one producer, want 1", h)
	}
	if got := len(r.prod.TakeReleased()); got != n {
		t.Fatalf("%d releases, want %d", got, n)
	}
}

func TestGenerationBumpDuringShmReadIsDetected(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportShm})
	r.hold(t, "req-a", 2, 3)
	testHookShmCopied = func(string) { r.pool.reuse(3) }
	t.Cleanup(func() { testHookShmCopied = nil })
	err := r.cons.Pull(ctxT(t), r.params("req-a", 2, 3), newLocalBlocks(2, tiny.BlockBytes))
	wantErr(t, err, ErrGenerationChanged, "generation changed during read: block 3 of request \"req-a\"", "from generation 0 to 1")
	// The consumer still told the producer it is done with the request.
	if rel := r.prod.TakeReleased(); len(rel) != 1 || rel[0].Reason != ReleasedDone {
		t.Fatalf("released %+v, want req-a done", rel)
	}
}

// reusingMemory reuses a block the moment the producer starts sending it:
// an engine bug the producer must report instead of sending bad bytes as
// good.
type reusingMemory struct {
	*testPool
	victim int
}

func (m reusingMemory) Block(id int) []byte {
	if id == m.victim {
		m.reuse(id)
	}
	return m.testPool.Block(id)
}

func TestGenerationBumpDuringTCPReadIsDetected(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP, wrapMem: func(p *testPool) BlockMemory { return reusingMemory{p, 1} }})
	r.hold(t, "req-a", 0, 1)
	err := r.cons.Pull(ctxT(t), r.params("req-a", 0, 1), newLocalBlocks(2, tiny.BlockBytes))
	wantErr(t, err, ErrGenerationChanged, "block 1 of request \"req-a\"")
}

func TestShmOnAnotherHostIsRefusedWhenForced(t *testing.T) {
	info := tiny
	info.EngineID = "far"
	info.Host = HostIdentity{BootID: "another-boot", Hostname: "elsewhere"}
	_, peer := newFakeProducer(t, info, func(net.Conn, header, []byte) bool { return false })
	for _, tc := range []struct {
		transport Transport
		want      string
	}{
		{TransportShm, `--kv-transport=shm, but prefill engine far runs on another host (boot id "another-boot", hostname "elsewhere")`},
	} {
		ci := tiny
		ci.EngineID = "d"
		c, err := NewConsumer(ConsumerConfig{Local: ci, Transport: tc.transport, Secret: testSecret, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		err = c.Pull(ctxT(t), RemoteParams{EngineID: "far", RequestID: "r", Host: peer.Host, Port: peer.Port, BlockIDs: []int{0}}, newLocalBlocks(1, tiny.BlockBytes))
		wantErr(t, err, nil, tc.want)
		c.Close()
	}
}

// TestPeerDeathMidTransferFailsPromptly runs each case in fake time
// (testing/synctest, the side channel in memory), so "promptly" is exact:
// the pull fails within the consumer's IOTimeout, however loaded the host.
func TestPeerDeathMidTransferFailsPromptly(t *testing.T) {
	info := tiny
	info.EngineID = "dying"
	tests := []struct {
		name    string
		respond func(c net.Conn, h header)
	}{
		{"the producer closes the connection after half a block", func(c net.Conn, h header) {
			c.Write(dataHeader(h.Corr, tiny.BlockBytes))
			c.Write(make([]byte, tiny.BlockBytes/2))
		}},
		{"the producer stops sending mid-block", func(c net.Conn, h header) {
			c.Write(dataHeader(h.Corr, tiny.BlockBytes))
			c.Write(make([]byte, tiny.BlockBytes/2))
			time.Sleep(2 * time.Second) // longer than the consumer's IOTimeout
		}},
		{"the producer sends a block of the wrong size", func(c net.Conn, h header) {
			c.Write(dataHeader(h.Corr, 7))
			c.Write(make([]byte, 7))
			time.Sleep(time.Second)
		}},
	}
	const ioTimeout = 300 * time.Millisecond
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// synctest.Test fails the test if a goroutine of its bubble
			// outlives it (blocked: "deadlock"), so no goroutine count here:
			// runtime.NumGoroutine counts the whole process, and a count
			// polled against the bubble's fake clock gave up at once on a
			// goroutine outside it (a flake under the race detector).
			synctest.Test(t, func(t *testing.T) {
				mem := testutil.NewMemNet()
				f, peer := serveFakeProducer(t, mem.Listen(), info, func(c net.Conn, h header, _ []byte) bool {
					if h.Type == msgRead {
						tc.respond(c, h)
					}
					return false
				})
				ci := tiny
				ci.EngineID = "d"
				c, err := NewConsumer(ConsumerConfig{Local: ci, Transport: TransportTCP, IOTimeout: ioTimeout, DialTimeout: ioTimeout, Dial: mem.Dial, Secret: testSecret, Logger: discardLogger()})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				err = c.Pull(ctxT(t), RemoteParams{EngineID: "dying", RequestID: "r", Host: peer.Host, Port: peer.Port, BlockIDs: []int{0, 1}}, newLocalBlocks(2, tiny.BlockBytes))
				if err == nil {
					t.Fatal("pull from a dying producer succeeded")
				}
				if d := time.Since(start); d > ioTimeout {
					t.Fatalf("pull took %v to fail, more than its IOTimeout %v: %v", d, ioTimeout, err)
				}
				c.Close()
				f.close()
			})
		})
	}
}

func TestPullCancellationStopsWritingIntoDestination(t *testing.T) {
	info := tiny
	info.EngineID = "slow"
	_, peer := newFakeProducer(t, info, func(c net.Conn, h header, _ []byte) bool {
		c.Write(dataHeader(h.Corr, tiny.BlockBytes))
		time.Sleep(time.Second)
		return false
	})
	ci := tiny
	ci.EngineID = "d"
	c, _ := NewConsumer(ConsumerConfig{Local: ci, Transport: TransportTCP, Secret: testSecret, Logger: discardLogger()})
	defer c.Close()
	// The engine aborts a request's pull by canceling its context.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	err := c.Pull(ctx, RemoteParams{EngineID: "slow", RequestID: "r", Host: peer.Host, Port: peer.Port, BlockIDs: []int{0}}, newLocalBlocks(1, tiny.BlockBytes))
	wantErr(t, err, context.Canceled)
	if FailureReason(err) != "canceled" {
		t.Fatalf("reason %q", FailureReason(err))
	}
}

func TestHandshakeTimeoutIsAnIOFailure(t *testing.T) {
	// A listener that accepts and never answers: the handshake times out.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ci := tiny
	ci.EngineID = "d"
	c, _ := NewConsumer(ConsumerConfig{Local: ci, DialTimeout: 200 * time.Millisecond, Secret: testSecret, Logger: discardLogger()})
	defer c.Close()
	host, port := splitAddr(ln.Addr().String())
	err = c.Pull(ctxT(t), RemoteParams{EngineID: "mute", RequestID: "r", Host: host, Port: port, BlockIDs: []int{0}}, newLocalBlocks(1, tiny.BlockBytes))
	wantErr(t, err, nil, "handshake with prefill engine mute")
	if r := FailureReason(err); r != "io" {
		t.Fatalf("a handshake timeout is labelled %q, want io", r)
	}
}

func TestRestartedPrefillIsDetected(t *testing.T) {
	for _, tr := range []Transport{TransportTCP, TransportShm} {
		t.Run(string(tr), func(t *testing.T) {
			a := newRig(t, rigOpts{transport: tr, engineID: "prefill-old"})
			a.hold(t, "r1", 1)
			a.hold(t, "r2", 2)
			if err := a.cons.Pull(ctxT(t), a.params("r1", 1), newLocalBlocks(1, tiny.BlockBytes)); err != nil {
				t.Fatal(err)
			}
			old := a.cons.peers["prefill-old"]
			// The prefill restarts on the same port with a new engine id.
			addr := a.ln.Addr().String()
			a.prod.Close()
			<-a.errc
			a.errc = nil
			b := newRig(t, rigOpts{transport: tr, engineID: "prefill-new", addr: addr})
			b.hold(t, "r3", 4)

			err := a.cons.Pull(ctxT(t), a.params("r2", 2), newLocalBlocks(1, tiny.BlockBytes))
			wantErr(t, err, ErrPeerRestarted, "prefill engine prefill-old at "+addr+" is gone and engine prefill-new answers there now")
			if _, ok := a.cons.peers["prefill-old"]; ok {
				t.Fatal("state of the old engine was kept")
			}
			if !old.dropped || old.shm != nil || len(old.idle) != 0 {
				t.Fatalf("old engine state not released: dropped=%v shm=%v idle=%d", old.dropped, old.shm != nil, len(old.idle))
			}
			// Requests for the new engine work through the same consumer.
			dst := newLocalBlocks(1, tiny.BlockBytes)
			if err := a.cons.Pull(ctxT(t), b.params("r3", 4), dst); err != nil {
				t.Fatal(err)
			}
			checkBlocks(t, b.pool, []int{4}, dst)
		})
	}
}

func TestHostileClientIsRejectedAndServerSurvives(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.hold(t, "req-a", 1)
	hello := frame(msgHello, 1, func(b []byte) []byte { return append(b, make([]byte, nonceSize)...) })
	tests := []struct {
		name   string
		authed bool // send bytes after a real handshake
		bytes  []byte
		code   ErrorCode
	}{
		{"garbage", false, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), CodeBadFrame},
		{"a READ before HELLO", false, frame(msgRead, 1, func(b []byte) []byte { return appendBlockRequest(b, &blockRequest{"req-a", []int{1}}) }), CodeBadFrame},
		{"a DONE before HELLO", false, frame(msgDone, 1, func(b []byte) []byte { return appendString(b, "req-a") }), CodeBadFrame},
		{"a huge control length", false, func() []byte { b := make([]byte, headerSize); putHeader(b, msgHello, 1, 1<<30); return b }(), CodeBadFrame},
		{"a HELLO longer than any handshake frame", false, func() []byte { b := make([]byte, headerSize); putHeader(b, msgHello, 1, maxPreAuthPayload+1); return b }(), CodeBadFrame},
		{"a HELLO without a nonce", false, frame(msgHello, 1, nil), CodeBadFrame},
		{"an AUTH with a wrong proof", false, append(bytes.Clone(hello), frame(msgAuth, 1, func(b []byte) []byte { return appendInfo(append(b, make([]byte, macSize)...), &tiny) })...), CodeUnauthenticated},
		{"a DATA frame from a consumer", true, dataHeader(2, 4), CodeBadFrame},
		{"another protocol version", false, func() []byte { b := bytes.Clone(hello); b[4] = 1; return b }(), CodeVersion},
		{"a READ with a block count beyond its payload", true, frame(msgRead, 2, func(b []byte) []byte { return appendU32(appendString(b, "req-a"), 1<<30) }), CodeBadFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", r.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.authed {
				if _, err := rawClientHandshake(t, c, testSecret); err != nil {
					t.Fatal(err)
				}
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write(tc.bytes)
			var h header
			var p []byte
			for {
				h, p, err = readControl(c)
				if err != nil {
					t.Fatalf("no ERROR frame: %v", err)
				}
				if h.Type != msgChallenge {
					break
				}
			}
			if re := decodeError(p); h.Type != msgError || re.Code != tc.code {
				t.Fatalf("got %s %+v, want ERROR %s", h.Type, re, tc.code)
			}
			if _, _, err := readControl(c); err == nil {
				t.Fatal("connection left open after a protocol violation")
			}
		})
	}
	dst := newLocalBlocks(1, tiny.BlockBytes)
	if err := r.cons.Pull(ctxT(t), r.params("req-a", 1), dst); err != nil {
		t.Fatalf("server broken by hostile clients: %v", err)
	}
}

func TestReadOfBlockOutsideTheRequestIsRefused(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP})
	r.hold(t, "req-a", 1, 2)
	err := r.cons.Pull(ctxT(t), r.params("req-a", 2, 9), newLocalBlocks(2, tiny.BlockBytes))
	wantErr(t, err, ErrBadBlock, "block 9 is not one of the 2 blocks of request \"req-a\"")
	// The refused read did not pin the lease; the failed pull sent DONE.
	if rel := r.prod.TakeReleased(); len(rel) != 1 {
		t.Fatalf("released %+v", rel)
	}
}

func TestConnectionLimit(t *testing.T) {
	// The consumer retries a busy producer until DialTimeout ends, then
	// reports the refusal. The timeout is long enough that a loaded CI
	// machine still completes the first dial and hears "busy" within it
	// (at 300 ms one run timed out in the TCP connect and reported that).
	r := newRig(t, rigOpts{prodMut: func(pc *ProducerConfig) { pc.MaxConns = 1 }, consMut: func(cc *ConsumerConfig) { cc.DialTimeout = 2 * time.Second }})
	err := pullFromFullProducer(t, r)
	wantErr(t, err, nil, "prefill engine prefill-1 has 1 side-channel connections, its limit")
	if FailureReason(err) != "busy" {
		t.Fatalf("reason %q for %v", FailureReason(err), err)
	}
}

// A retry that the dial window's deadline cuts short reports the busy
// refusal heard before it, not the timeout: here the first dial reaches the
// full producer and hears busy, every later one a listener that never
// answers, so the window always ends inside a handshake.
func TestBusyRefusalOutlivesTheDeadlineThatCutsItsRetry(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	var dials atomic.Int32
	r := newRig(t, rigOpts{prodMut: func(pc *ProducerConfig) { pc.MaxConns = 1 }, consMut: func(cc *ConsumerConfig) {
		cc.DialTimeout = 500 * time.Millisecond
		var d net.Dialer
		cc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				addr = silent.Addr().String()
			}
			return d.DialContext(ctx, network, addr)
		}
	}})
	err = pullFromFullProducer(t, r)
	if FailureReason(err) != "busy" || dials.Load() < 2 {
		t.Fatalf("after %d dials: reason %q for %v; want the busy refusal", dials.Load(), FailureReason(err), err)
	}
}

// pullFromFullProducer takes r's producer's one connection slot with an
// authenticated raw connection (only those take slots), held until the
// test ends, and returns what the consumer's pull of a held block gets.
func pullFromFullProducer(t *testing.T, r *rig) error {
	t.Helper()
	c1, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close() })
	if _, err := rawClientHandshake(t, c1, testSecret); err != nil {
		t.Fatal(err)
	}
	r.hold(t, "req-a", 1)
	return r.cons.Pull(ctxT(t), r.params("req-a", 1), newLocalBlocks(1, tiny.BlockBytes))
}

func TestProducerCloseEndsAllGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	r := newRig(t, rigOpts{})
	r.hold(t, "a", 1)
	if err := r.cons.Pull(ctxT(t), r.params("a", 1), newLocalBlocks(1, tiny.BlockBytes)); err != nil {
		t.Fatal(err)
	}
	idle, err := net.Dial("tcp", r.ln.Addr().String()) // a silent client
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	r.close(t)
	checkNoLeak(t, base)
}

// Engines on CPUs that chose different kernel sets serve the same model:
// they exchange KV (valid, not bit-identical), and the handshake carries
// each one's set, so the decode can say so. A peer from before the field
// was appended decodes with no set.
func TestHandshakeCarriesKernelSets(t *testing.T) {
	local, remote := tiny, tiny
	local.Kernels, remote.Kernels = "avx2", "avx512bf16"
	if err := checkCompat(local, remote); err != nil {
		t.Fatalf("different kernel sets refused: %v", err)
	}
	got, err := decodeInfo(appendInfo(nil, &remote))
	if err != nil || got.Kernels != "avx512bf16" {
		t.Fatalf("round trip: kernels %q, err %v", got.Kernels, err)
	}
	remote.Kernels = ""
	old := appendInfo(nil, &remote)
	old = old[:len(old)-2] // an empty string's length prefix: the field absent
	if got, err := decodeInfo(old); err != nil || got.Kernels != "" || got.EngineID != remote.EngineID {
		t.Fatalf("a payload without the field: %+v, %v", got, err)
	}
}
