package kvxfer

import (
	"context"
	"crypto/rand"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// smollm is the KV geometry of smollm2-135m: 737,280 bytes per f32 block.
var smollm = Info{
	ModelFingerprint: "smollm2-135m@test",
	KVDType:          "f32",
	Layers:           30,
	KVHeads:          3,
	HeadDim:          64,
	BlockSize:        16,
	BlockBytes:       16 * 30 * 2 * 3 * 64 * 4,
}

// tiny is a small geometry for fast tests: 2 layers, 1 head of 8, block 4.
var tiny = Info{
	ModelFingerprint: "tiny@test",
	KVDType:          "f32",
	Layers:           2,
	KVHeads:          1,
	HeadDim:          8,
	BlockSize:        4,
	BlockBytes:       4 * 2 * 2 * 1 * 8 * 4,
}

// testPool is a real KV pool memory (kvcache.Memory: a sealed memfd with
// the pool header, blocks and generations), as engines offer it. It
// implements BlockMemory.
type testPool struct {
	mem   *kvcache.Memory
	n, bb int
}

func newTestPool(t testing.TB, n int, geom Info) *testPool {
	t.Helper()
	dt, _, err := kvlayout.ParseElemType(geom.KVDType)
	if err != nil {
		t.Fatal(err)
	}
	l := kvlayout.Layout{BlockSize: geom.BlockSize, Layers: geom.Layers, KVHeads: geom.KVHeads, HeadDim: geom.HeadDim, DType: dt}
	if l.BlockBytes() != geom.BlockBytes {
		t.Fatalf("test geometry %+v has %d-byte blocks, its layout %d", geom, geom.BlockBytes, l.BlockBytes())
	}
	mem, err := kvcache.NewMemory("", l, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return &testPool{mem: mem, n: n, bb: geom.BlockBytes}
}

func (p *testPool) NumBlocks() int           { return p.n }
func (p *testPool) BlockBytes() int          { return p.bb }
func (p *testPool) Block(id int) []byte      { return p.mem.BlockBytes(int32(id)) }
func (p *testPool) Generation(id int) uint64 { return p.mem.Generation(int32(id)) }

// reuse simulates the pool reallocating a block: bump, then overwrite.
func (p *testPool) reuse(id int) {
	p.mem.BumpGenerations([]int32{int32(id)})
	clear(p.Block(id))
}

func (p *testPool) layout() *ShmLayout {
	blocks, gens := p.mem.FileOffsets()
	return &ShmLayout{Path: p.mem.Path(), BlocksOffset: blocks, GenerationsOffset: gens}
}

func (p *testPool) fillRandom(t testing.TB) {
	t.Helper()
	for id := range p.n {
		rand.Read(p.Block(id))
	}
}

// newLocalBlocks returns n destination blocks in ordinary memory.
func newLocalBlocks(n, blockBytes int) [][]byte {
	all := make([]byte, n*blockBytes)
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = all[i*blockBytes : (i+1)*blockBytes : (i+1)*blockBytes]
	}
	return dst
}

// rig is one producer serving on loopback and one consumer.
type rig struct {
	pool *testPool
	prod *Producer
	cons *Consumer
	ln   net.Listener
	peer Peer
	errc chan error
}

type rigOpts struct {
	geom      Info
	blocks    int
	transport Transport
	noShm     bool
	prodMut   func(*ProducerConfig)
	consMut   func(*ConsumerConfig)
	engineID  string
	addr      string
	wrapMem   func(*testPool) BlockMemory // the producer's view of the pool
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	if o.geom.BlockBytes == 0 {
		o.geom = tiny
	}
	if o.blocks == 0 {
		o.blocks = 16
	}
	if o.engineID == "" {
		o.engineID = "prefill-1"
	}
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	r := &rig{pool: newTestPool(t, o.blocks, o.geom), errc: make(chan error, 1)}
	r.pool.fillRandom(t)
	pi := o.geom
	pi.EngineID = o.engineID
	pc := ProducerConfig{Local: pi, Memory: r.pool, Shm: r.pool.layout(), Secret: testSecret, Logger: discardLogger()}
	if o.wrapMem != nil {
		pc.Memory = o.wrapMem(r.pool)
	}
	if o.noShm {
		pc.Shm = nil
	}
	if o.prodMut != nil {
		o.prodMut(&pc)
	}
	var err error
	if r.prod, err = NewProducer(pc); err != nil {
		t.Fatal(err)
	}
	if r.ln, err = net.Listen("tcp", o.addr); err != nil {
		t.Fatal(err)
	}
	go func() { r.errc <- r.prod.Serve(r.ln) }()
	ci := o.geom
	ci.EngineID = "decode-1"
	cc := ConsumerConfig{Local: ci, Transport: o.transport, Secret: testSecret, Logger: discardLogger()}
	if o.consMut != nil {
		o.consMut(&cc)
	}
	if r.cons, err = NewConsumer(cc); err != nil {
		t.Fatal(err)
	}
	host, port := splitAddr(r.ln.Addr().String())
	r.peer = Peer{EngineID: o.engineID, Host: host, Port: port}
	t.Cleanup(func() { r.close(t) })
	return r
}

func (r *rig) close(t testing.TB) {
	r.cons.Close()
	r.prod.Close()
	if r.errc != nil {
		if err := <-r.errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
		r.errc = nil
	}
}

func (r *rig) params(req string, blocks ...int) RemoteParams {
	return RemoteParams{EngineID: r.peer.EngineID, RequestID: req, Host: r.peer.Host, Port: r.peer.Port, BlockIDs: blocks}
}

func (r *rig) hold(t testing.TB, req string, blocks ...int) {
	t.Helper()
	if err := r.prod.Hold(req, blocks, time.Now()); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkNoLeak fails the test if goroutines started after baseline are
// still running once everything is closed.
func checkNoLeak(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutine leak: %d running, %d at start\n%s", runtime.NumGoroutine(), baseline, buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantErr(t *testing.T, err error, target error, substrs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", target)
	}
	if target != nil && !isErr(err, target) {
		t.Fatalf("error %q does not wrap %v", err, target)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

// fakeProducer is a hand-written side channel for fault injection: it
// answers HELLO with info, then runs onRequest for every later frame.
type fakeProducer struct {
	ln        net.Listener
	info      Info
	onRequest func(c net.Conn, h header, payload []byte) bool // false: close
	wg        sync.WaitGroup
}

func newFakeProducer(t *testing.T, info Info, onRequest func(net.Conn, header, []byte) bool) (*fakeProducer, Peer) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveFakeProducer(t, ln, info, onRequest)
}

// serveFakeProducer is newFakeProducer on ln (a testutil.MemNet listener
// for a test in a synctest bubble).
func serveFakeProducer(t *testing.T, ln net.Listener, info Info, onRequest func(net.Conn, header, []byte) bool) (*fakeProducer, Peer) {
	f := &fakeProducer{ln: ln, info: info, onRequest: onRequest}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(f.close)
	host, port := splitAddr(ln.Addr().String())
	return f, Peer{EngineID: info.EngineID, Host: host, Port: port}
}

func (f *fakeProducer) close() { f.ln.Close(); f.wg.Wait() }

func (f *fakeProducer) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Go(func() {
			defer c.Close()
			if err := fakeServerHandshake(c, testSecret, f.info); err != nil {
				return
			}
			for {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				h, p, err := readControl(c)
				if err != nil {
					return
				}
				if !f.onRequest(c, h, p) {
					return
				}
			}
		})
	}
}

func dataHeader(corr uint64, n int) []byte {
	b := make([]byte, headerSize)
	putHeader(b, msgData, corr, n)
	return b
}
