package e2e

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// More side-channel message types and error codes (internal/kvxfer/wire.go),
// for the fake producer below.
const (
	msgHelloAck  = 2
	msgRead      = 3
	msgShmRead   = 6
	msgShmGens   = 7
	msgDone      = 8
	msgHeartbeat = 9
	msgAck       = 10
	codeInternal = 9
)

// wireInfo is the handshake's Info (HELLO_ACK, and the consumer's in AUTH),
// field by field in wire order (internal/kvxfer/wire.go, appendInfo).
type wireInfo struct {
	EngineID, Fingerprint, KVDType      string
	Layers, KVHeads, HeadDim, BlockSize uint32
	BlockBytes                          uint64
	NumBlocks                           uint32
	BootID, Hostname                    string
	LeaseMs                             uint64
	ShmPath                             string
	ShmSize, BlocksOff, GensOff         uint64
	Dev, Inode                          uint64
	Pid                                 uint32
	Generation, ClockNs                 uint64
}

func (w *wireInfo) encode() []byte {
	var b []byte
	str := func(s string) { b = binary.LittleEndian.AppendUint16(b, uint16(len(s))); b = append(b, s...) }
	u32 := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	str(w.EngineID)
	str(w.Fingerprint)
	str(w.KVDType)
	u32(w.Layers)
	u32(w.KVHeads)
	u32(w.HeadDim)
	u32(w.BlockSize)
	u64(w.BlockBytes)
	u32(w.NumBlocks)
	str(w.BootID)
	str(w.Hostname)
	u64(w.LeaseMs)
	str(w.ShmPath)
	u64(w.ShmSize)
	u64(w.BlocksOff)
	u64(w.GensOff)
	u64(w.Dev)
	u64(w.Inode)
	u32(w.Pid)
	u64(w.Generation)
	u64(w.ClockNs)
	return b
}

func decodeWireInfo(p []byte) (wireInfo, error) {
	var w wireInfo
	short := false
	take := func(n int) []byte {
		if short || len(p) < n {
			short = true
			return make([]byte, n)
		}
		v := p[:n]
		p = p[n:]
		return v
	}
	str := func() string { return string(take(int(binary.LittleEndian.Uint16(take(2))))) }
	u32 := func() uint32 { return binary.LittleEndian.Uint32(take(4)) }
	u64 := func() uint64 { return binary.LittleEndian.Uint64(take(8)) }
	w.EngineID, w.Fingerprint, w.KVDType = str(), str(), str()
	w.Layers, w.KVHeads, w.HeadDim, w.BlockSize = u32(), u32(), u32(), u32()
	w.BlockBytes = u64()
	w.NumBlocks = u32()
	w.BootID, w.Hostname = str(), str()
	w.LeaseMs = u64()
	w.ShmPath = str()
	w.ShmSize, w.BlocksOff, w.GensOff, w.Dev, w.Inode = u64(), u64(), u64(), u64(), u64()
	w.Pid = u32()
	w.Generation, w.ClockNs = u64(), u64()
	if short {
		return w, errors.New("Info payload too short")
	}
	return w, nil
}

func infoMAC(key, nd, np, info []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tandem kv handshake info"))
	m.Write(nd)
	m.Write(np)
	m.Write(info)
	return m.Sum(nil)
}

// liar is a fake prefill side channel run by the test process: it knows
// the cluster secret, completes the real mutual handshake, and announces
// shared memory of its choosing (offer). It answers READ with an ERROR
// (it serves no KV over TCP), SHM_READ with onShmRead's frame, and DONE
// and HEARTBEAT with an ACK. Whenever a read arrives it records whether
// the decode has the offered file mapped at that moment.
type liar struct {
	id   string
	port int
	// offer fills the shared-memory fields of the producer's Info from
	// the consumer's (called once, at the first AUTH).
	offer func(l *liar, consumer wireInfo) (wireInfo, error)
	// onRead, if set, runs when a read arrives, before it is answered.
	onRead func()
	// onShmRead answers SHM_READ (corr, the request's block count).
	onShmRead func(corr uint64, blocks int) []byte
	// file is the offered file's identity, for the maps check.
	dev, ino  uint64
	decodePid int

	mu       sync.Mutex
	closers  []io.Closer // closed when the test ends
	info     *wireInfo
	reads    []string // "READ" or "SHM_READ", in order
	mappedAt []bool   // whether the decode had the file mapped at each read
	problems []string
}

func startLiar(t *testing.T, l *liar) *liar {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.port = ln.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.closers {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.serve(c)
		}
	}()
	return l
}

func (l *liar) problem(format string, args ...any) {
	l.mu.Lock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// keep closes c when the test ends.
func (l *liar) keep(c io.Closer) {
	l.mu.Lock()
	l.closers = append(l.closers, c)
	l.mu.Unlock()
}

func (l *liar) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	key := channelKey(clusterSecret)
	// The consumer matches each answer to its request's correlation id:
	// the handshake's answers carry the HELLO's.
	hc, typ, nd, err := readKVFrameCorr(c)
	if err != nil || typ != msgHello || len(nd) != nonceBytes {
		l.problem("first frame: type %d, %d bytes, %v; want HELLO", typ, len(nd), err)
		return
	}
	np := make([]byte, nonceBytes)
	rand.Read(np)
	c.Write(kvFrame(msgChallenge, hc, append(append([]byte(nil), np...), handshakeMAC(key, "producer", nd, np)...)))
	_, typ, auth, err := readKVFrameCorr(c)
	if err != nil || typ != msgAuth || len(auth) < sha256.Size {
		l.problem("AUTH: type %d, %v", typ, err)
		return
	}
	if !hmac.Equal(auth[:sha256.Size], handshakeMAC(key, "consumer", nd, np)) {
		l.problem("the decode's proof does not match the cluster secret")
		return
	}
	consumer, err := decodeWireInfo(auth[sha256.Size:])
	if err != nil {
		l.problem("the decode's Info: %v", err)
		return
	}
	l.mu.Lock()
	if l.info == nil {
		l.mu.Unlock()
		w, err := l.offer(l, consumer)
		if err != nil {
			l.problem("offering shared memory: %v", err)
			return
		}
		l.mu.Lock()
		l.info = &w
	}
	w := *l.info
	l.mu.Unlock()
	w.ClockNs = uint64(time.Now().UnixNano())
	info := w.encode()
	c.Write(kvFrame(msgHelloAck, hc, append(info, infoMAC(key, nd, np, info)...)))
	for {
		corr, typ, p, err := readKVFrameCorr(c)
		if err != nil {
			return
		}
		switch typ {
		case msgRead, msgShmRead:
			l.mu.Lock()
			dev, ino := l.dev, l.ino
			l.mu.Unlock()
			mapped, err := mapsFile(l.decodePid, dev, ino)
			if err != nil {
				l.problem("reading the decode's mappings: %v", err)
			}
			l.mu.Lock()
			l.reads = append(l.reads, map[byte]string{msgRead: "READ", msgShmRead: "SHM_READ"}[typ])
			l.mappedAt = append(l.mappedAt, mapped)
			l.mu.Unlock()
			if l.onRead != nil {
				l.onRead()
			}
			if typ == msgRead || l.onShmRead == nil {
				c.Write(kvFrame(msgError, corr, errorPayload(codeInternal, "this fake prefill serves no KV")))
				continue
			}
			n := 0
			if len(p) >= 2 {
				idLen := int(binary.LittleEndian.Uint16(p))
				if len(p) >= 2+idLen+4 {
					n = int(binary.LittleEndian.Uint32(p[2+idLen:]))
				}
			}
			c.Write(l.onShmRead(corr, n))
		case msgDone, msgHeartbeat:
			c.Write(kvFrame(msgAck, corr, []byte{0, 0, 0, 0}))
		default:
			l.problem("unexpected frame type %d", typ)
			return
		}
	}
}

// readKVFrameCorr reads one frame and returns its correlation id too.
func readKVFrameCorr(c net.Conn) (uint64, byte, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, 0, nil, err
	}
	if string(h[:4]) != "TKVX" {
		return 0, 0, nil, fmt.Errorf("bad magic %q", h[:4])
	}
	n := binary.LittleEndian.Uint32(h[16:20])
	if n > 1<<20 {
		return 0, 0, nil, fmt.Errorf("%d-byte payload", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c, p); err != nil {
		return 0, 0, nil, err
	}
	return binary.LittleEndian.Uint64(h[8:16]), h[5], p, nil
}

func errorPayload(code uint16, msg string) []byte {
	b := binary.LittleEndian.AppendUint16(nil, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// mapsFile reports whether process pid has the file (dev, ino) mapped.
func mapsFile(pid int, dev, ino uint64) (bool, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
	s := bufio.NewScanner(f)
	for s.Scan() {
		// address perms offset dev inode path
		fs := strings.Fields(s.Text())
		if len(fs) >= 5 && fs[3] == want && fs[4] == strconv.FormatUint(ino, 10) {
			return true, nil
		}
	}
	return false, s.Err()
}

// fileID is the device and inode of the file at path.
func fileID(path string) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Dev), st.Ino, nil
}

// poolFor makes a real, sealed pool memfd in the test process with the
// decode's KV geometry (what an honest prefill of the same model has).
func (l *liar) poolFor(consumer wireInfo, blocks int) (*kvcache.Memory, error) {
	dt, _, err := kvlayout.ParseElemType(consumer.KVDType)
	if err != nil {
		return nil, err
	}
	layout := kvlayout.Layout{BlockSize: int(consumer.BlockSize), Layers: int(consumer.Layers), KVHeads: int(consumer.KVHeads), HeadDim: int(consumer.HeadDim), DType: dt}
	if layout.BlockBytes() != int(consumer.BlockBytes) {
		return nil, fmt.Errorf("layout %+v has %d-byte blocks, the decode announces %d", layout, layout.BlockBytes(), consumer.BlockBytes)
	}
	m, err := kvcache.NewMemory("", layout, blocks)
	if err != nil {
		return nil, err
	}
	l.keep(m)
	return m, nil
}

// mirror is the producer Info a compatible prefill of the decode's model
// on this host would announce, with the pool described by m's geometry.
func mirror(id string, consumer wireInfo, m *kvcache.Memory) wireInfo {
	g := m.Geometry()
	return wireInfo{
		EngineID: id, Fingerprint: consumer.Fingerprint, KVDType: consumer.KVDType,
		Layers: consumer.Layers, KVHeads: consumer.KVHeads, HeadDim: consumer.HeadDim, BlockSize: consumer.BlockSize,
		BlockBytes: consumer.BlockBytes, NumBlocks: uint32(g.NumBlocks),
		BootID: consumer.BootID, Hostname: consumer.Hostname, LeaseMs: 30_000,
		ShmSize: uint64(g.Size), BlocksOff: uint64(g.BlocksOffset), GensOff: uint64(g.GenerationsOffset),
		Pid: uint32(os.Getpid()), Generation: 0x5eed,
	}
}

// copyInto writes the bytes of the file at src into f.
func copyInto(f *os.File, src string) error {
	b, err := os.ReadFile(src)
	if err == nil {
		_, err = f.WriteAt(b, 0)
	}
	return err
}

// offerFile sets w's shared memory to the file at path, with its identity,
// and records that identity for the maps check.
func (l *liar) offerFile(w wireInfo, path string) (wireInfo, error) {
	dev, ino, err := fileID(path)
	if err != nil {
		return w, err
	}
	l.mu.Lock()
	l.dev, l.ino = dev, ino
	l.mu.Unlock()
	w.ShmPath, w.Dev, w.Inode = path, dev, ino
	return w, nil
}

// prefillPoolFD finds the pool memfd among process pid's descriptors.
func prefillPoolFD(t *testing.T, pid int) string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, "/memfd:tandem-kv") {
			return p
		}
	}
	t.Fatalf("no /memfd:tandem-kv among the descriptors of pid %d", pid)
	return ""
}

// checkServing fails t unless e still runs and its /health answers 200.
func checkServing(t *testing.T, e *engine) {
	t.Helper()
	if e.exited() {
		t.Fatalf("%s exited (%v): a lying prefill crashed it\n%s", e.name, e.err, tail(e.out.String(), 3000))
	}
	resp, err := client.Get(e.url + "/health")
	if err != nil {
		t.Fatalf("%s /health: %v", e.name, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s /health: %s", e.name, resp.Status)
	}
}

// TestFakePrefillLyingAboutSharedMemory: the test process plays a prefill's
// side channel that has the cluster secret (so it passes the real mutual
// handshake: authentication says who is in the cluster, not that it is
// honest) and offers a real decode engine, on the same host, shared memory
// it should not map: a regular file among its own descriptors, another
// process's pool memfd (the real prefill's), and a memfd whose size is not
// sealed, which it truncates when the decode's read arrives. The decode
// must map none of them (checked in its /proc/<pid>/maps when the read
// arrives) and say why in its log. Last, the fake offers its own sealed
// pool memfd, which the decode maps; during the read the fake tries to
// truncate it (the kernel refuses: that is why a mapped pool cannot make
// a copy fault) and drops all its pages (allowed; they read back as
// zeros), then claims generations the pool no longer has. Every pull must
// fail with a 5xx that says nothing about the network, the decode must
// not fault, and it must still serve a real P/D request afterwards.
//
// The fault path itself (debug.SetPanicOnFault) cannot be reached here
// while the seal check works: a decode built without it maps the unsealed
// memfd, its copy faults on the truncated file, and the pull fails with
// "reading the prefill's KV pool mapping faulted" while the decode keeps
// serving; this test then fails on the SHM_READ and the mapping.
func TestFakePrefillLyingAboutSharedMemory(t *testing.T) {
	weights := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-peers")
	const vocab, n = 512, 40

	prefill := startEngine(t, engineSpec{name: "prefill", model: weights, role: "prefill", env: withSecret})
	decode := startEngine(t, engineSpec{name: "decode", model: weights, role: "decode", env: withSecret,
		args: []string{"--kv-load-failure-policy", "fail", "--kv-transport", "auto"}})
	decodePid := decode.cmd.Process.Pid

	seed := uint64(40000)
	// pullFrom sends a request whose params, signed with the cluster's
	// secret, name l as the prefill; it returns the decode's answer.
	pullFrom := func(t *testing.T, l *liar) reply {
		t.Helper()
		seed++
		body := completionBody(tokenPrompt(seed, n, vocab), samplings[0], false)
		p := forgedParams("127.0.0.1", l.port, n)
		p["remote_engine_id"] = l.id
		body["kv_transfer_params"] = signParams(t, p, body, time.Now().Add(time.Minute))
		return postJSON(t, decode.url+"/v1/completions", body)
	}
	// expectFailedPull checks the decode's answer to a pull from l: a 5xx
	// with an OpenAI-shaped body naming neither l nor a dial's outcome,
	// reads of kind want only, with the file mapped (or not) as wantMapped.
	expectFailedPull := func(t *testing.T, l *liar, r reply, want string, wantMapped bool) {
		t.Helper()
		if r.status < 500 {
			t.Errorf("status %d, want 5xx (--kv-load-failure-policy fail): %s", r.status, r.body)
		}
		checkErrorBody(t, r, "127.0.0.1:"+strconv.Itoa(l.port))
		t.Logf("status %d: %s", r.status, errorMessage(r.body))
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, p := range l.problems {
			t.Errorf("fake prefill: %s", p)
		}
		if len(l.reads) == 0 {
			t.Fatalf("the decode sent the fake prefill no read")
		}
		for i, k := range l.reads {
			if k != want {
				t.Errorf("read %d was %s, want %s", i, k, want)
			}
			if l.mappedAt[i] != wantMapped {
				t.Errorf("at read %d the decode had the offered file mapped: %v, want %v", i, l.mappedAt[i], wantMapped)
			}
		}
	}
	// expectLogged waits for the decode's log to say why it did not map.
	expectLogged := func(t *testing.T, why string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(decode.out.String(), why) {
			if time.Now().After(deadline) {
				t.Errorf("the decode's log does not say %q", why)
				return
			}
			time.Sleep(pollInterval)
		}
	}

	t.Run("a regular file among the fake's own descriptors is not mapped", func(t *testing.T) {
		f, err := os.CreateTemp(t.TempDir(), "not-a-pool")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		l := &liar{id: "liar-regular-file", decodePid: decodePid}
		l.offer = func(l *liar, c wireInfo) (wireInfo, error) {
			m, err := l.poolFor(c, 8)
			if err != nil {
				return wireInfo{}, err
			}
			// A valid pool header and the right size: only the kind of
			// file is wrong.
			if err := copyInto(f, m.Path()); err != nil {
				return wireInfo{}, err
			}
			return l.offerFile(mirror(l.id, c, m), fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()))
		}
		startLiar(t, l)
		expectFailedPull(t, l, pullFrom(t, l), "READ", false)
		expectLogged(t, "not an anonymous memory file")
		checkServing(t, decode)
	})

	t.Run("another process's pool memfd (the real prefill's) is not mapped", func(t *testing.T) {
		theirs := prefillPoolFD(t, prefill.cmd.Process.Pid)
		l := &liar{id: "liar-other-process", decodePid: decodePid}
		l.offer = func(l *liar, c wireInfo) (wireInfo, error) {
			m, err := l.poolFor(c, 64) // the real prefill's geometry (--num-blocks 64)
			if err != nil {
				return wireInfo{}, err
			}
			return l.offerFile(mirror(l.id, c, m), theirs)
		}
		startLiar(t, l)
		expectFailedPull(t, l, pullFrom(t, l), "READ", false)
		expectLogged(t, "not a descriptor of its own process")
		checkServing(t, decode)
	})

	t.Run("a memfd whose size is not sealed, truncated once the decode has it, is not mapped", func(t *testing.T) {
		fd, err := unix.MemfdCreate("tandem-kv", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "unsealed")
		defer f.Close()
		l := &liar{id: "liar-unsealed-memfd", decodePid: decodePid}
		l.offer = func(l *liar, c wireInfo) (wireInfo, error) {
			m, err := l.poolFor(c, 8)
			if err != nil {
				return wireInfo{}, err
			}
			if err := copyInto(f, m.Path()); err != nil {
				return wireInfo{}, err
			}
			return l.offerFile(mirror(l.id, c, m), fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd))
		}
		// When the read arrives, after the handshake in which the decode
		// would have mapped the file and before it copies: a decode that
		// had mapped it would fault (SIGBUS) on that copy. (Were it mapped,
		// SHM_READ is answered with the pool's true generations, so the
		// copy would happen.)
		l.onRead = func() {
			if err := f.Truncate(0); err != nil {
				l.problem("truncate the unsealed memfd: %v", err)
			}
		}
		l.onShmRead = func(corr uint64, blocks int) []byte {
			gens := binary.LittleEndian.AppendUint32(nil, uint32(blocks))
			return kvFrame(msgShmGens, corr, append(gens, make([]byte, 8*blocks)...)) // all generation 0, as the pool's
		}
		startLiar(t, l)
		expectFailedPull(t, l, pullFrom(t, l), "READ", false)
		expectLogged(t, "can shrink")
		checkServing(t, decode)
	})

	t.Run("its own sealed memfd is mapped, cannot be truncated, and losing its pages mid-read fails the load without a fault", func(t *testing.T) {
		var (
			pool               *os.File // the fake's own descriptor of its pool
			truncErr, punchErr error
			punched            bool
		)
		l := &liar{id: "liar-sealed-memfd", decodePid: decodePid}
		l.offer = func(l *liar, c wireInfo) (wireInfo, error) {
			m, err := l.poolFor(c, 8)
			if err != nil {
				return wireInfo{}, err
			}
			f, err := os.OpenFile(m.Path(), os.O_RDWR, 0)
			if err != nil {
				return wireInfo{}, err
			}
			l.keep(f)
			l.mu.Lock()
			pool = f
			l.mu.Unlock()
			return l.offerFile(mirror(l.id, c, m), m.Path())
		}
		l.onShmRead = func(corr uint64, blocks int) []byte {
			l.mu.Lock()
			defer l.mu.Unlock()
			// The decode has the pool mapped now. Shrinking the file is
			// what would make its copy fault; the size seal makes the
			// kernel refuse.
			truncErr = pool.Truncate(0)
			// What the seals do allow: dropping every page (they read back
			// as zeros, not as a fault). Then claim generations the pool
			// no longer has, as a prefill whose blocks were reused would.
			var fi os.FileInfo
			if fi, punchErr = pool.Stat(); punchErr == nil {
				punchErr = unix.Fallocate(int(pool.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, fi.Size())
			}
			punched = true
			gens := binary.LittleEndian.AppendUint32(nil, uint32(blocks))
			for range blocks {
				gens = binary.LittleEndian.AppendUint64(gens, 7)
			}
			return kvFrame(msgShmGens, corr, gens)
		}
		startLiar(t, l)
		r := pullFrom(t, l)
		expectFailedPull(t, l, r, "SHM_READ", true)
		l.mu.Lock()
		defer l.mu.Unlock()
		if !punched {
			t.Fatal("the fake never got to truncate its pool")
		}
		if !errors.Is(truncErr, syscall.EPERM) {
			t.Errorf("truncating the sealed pool memfd under the decode's mapping: %v, want EPERM", truncErr)
		}
		if punchErr != nil {
			t.Errorf("punching a hole in the pool memfd: %v", punchErr)
		}
		if !bytes.Contains(r.body, []byte("generation")) {
			t.Errorf("the failure does not say the blocks changed: %s", r.body)
		}
		checkServing(t, decode)
	})

	t.Run("the decode still serves a real P/D request", func(t *testing.T) {
		checkServing(t, decode)
		body := completionBody(tokenPrompt(41000, 50, vocab), samplings[0], false)
		b := clone(body)
		b["kv_transfer_params"] = prefillLeg(t, prefill, body)
		before := decodeCounters(t, decode)
		got, _ := generate(t, decode.url, "/v1/completions", b)
		checkPulled(t, decodeCounters(t, decode).sub(before), got.PromptTokens, 0)
		// The same request computed on the decode alone gives the same
		// answer: the KV it pulled was the prefill's.
		want, _ := generate(t, decode.url, "/v1/completions", body)
		sameGeneration(t, want, got)
	})
	if strings.Contains(decode.out.String(), "SIGBUS") || strings.Contains(decode.out.String(), "fatal error") {
		t.Errorf("the decode's log reports a fault:\n%s", tail(decode.out.String(), 3000))
	}
	waitPoolsIdle(t, prefill, decode)
}
