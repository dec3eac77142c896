package kvxfer

import (
	"fmt"
	"math"
	"time"
)

// The messages' payloads, each an append and a decode function over
// codec.go's primitives: the handshake's Info (HELLO, HELLO_ACK), the block
// request of READ and SHM_READ, SHM_GENS's generations, the ids of
// HEARTBEAT and ACK, and DONE's request id.

// Info is what an engine tells its peer in the handshake (HELLO and
// HELLO_ACK): identity, model and KV geometry, and where its pool lives for
// same-host peers.
type Info struct {
	// EngineID identifies one engine process; a restarted engine has a new one.
	EngineID string
	// ModelFingerprint identifies the model and its weights (e.g. a hash of
	// config.json and the safetensors headers). Engines with different
	// fingerprints must not exchange KV.
	ModelFingerprint string
	// KVDType is the element type of the KV cache ("f32", "bf16").
	KVDType    string
	Layers     int
	KVHeads    int
	HeadDim    int
	BlockSize  int // tokens per block
	BlockBytes int // bytes per block (all layers, K and V)
	NumBlocks  int // blocks in the pool (producer); block ids are < NumBlocks
	// Host identifies the machine (kernel boot id and hostname) for
	// same-host detection.
	Host HostIdentity
	// Lease is the producer's lease duration (milliseconds on the wire);
	// consumers heartbeat every Lease/6. Zero in a consumer's HELLO.
	Lease time.Duration
	// Shm describes the producer's pool file; zero when it offers no shared
	// memory.
	Shm ShmLayout
	// Pid is the producer's process id (0 from a consumer): a same-host
	// decode maps the pool only through /proc/<Pid>/fd, so it can only
	// map a file the authenticated producer's process holds.
	Pid int
	// Generation changes whenever the producer's KV memory registration
	// does (a new process, even one reusing an engine id): params carrying
	// another generation name memory that is gone (vLLM's
	// remote_registration_generation).
	Generation uint64
	// Clock is the producer's wall clock when it sent HELLO_ACK (zero
	// from a consumer, and in the Info a consumer keeps): the consumer
	// estimates the clock offset from it, to judge deadlines stated in the
	// producer's clock.
	Clock time.Time
	// Kernels is the CPU kernel set the engine computes with (tensor.ISA;
	// "" from a peer that predates the field). Sets differ in rounding: KV
	// from a peer of another set is valid but not bit-identical to what
	// this engine would compute, so a consumer says so and goes on.
	Kernels string
}

// HostIdentity identifies a machine. Two engines are on the same host when
// both fields are equal and non-empty.
type HostIdentity struct {
	BootID   string // /proc/sys/kernel/random/boot_id
	Hostname string
}

// ShmLayout says where a KV pool lives in its shared-memory file, so a peer
// on the same host can map it read-only. Block i occupies
// [BlocksOffset + i*BlockBytes, +BlockBytes); its generation counter is the
// little-endian uint64 at GenerationsOffset + 8*i, updated atomically.
type ShmLayout struct {
	Path              string // e.g. /proc/<pid>/fd/<fd> of the pool's memory file
	Size              int64  // mapping size in bytes (the file's size)
	BlocksOffset      int64
	GenerationsOffset int64 // must be a multiple of 8
	// Dev and Inode identify the file (stat st_dev, st_ino) so a peer in
	// another mount namespace cannot mistake a different file at the same
	// path for this pool.
	Dev   uint64
	Inode uint64
}

func appendInfo(b []byte, in *Info) []byte {
	b = appendString(b, in.EngineID)
	b = appendString(b, in.ModelFingerprint)
	b = appendString(b, in.KVDType)
	b = appendU32(b, uint32(in.Layers))
	b = appendU32(b, uint32(in.KVHeads))
	b = appendU32(b, uint32(in.HeadDim))
	b = appendU32(b, uint32(in.BlockSize))
	b = appendU64(b, uint64(in.BlockBytes))
	b = appendU32(b, uint32(in.NumBlocks))
	b = appendString(b, in.Host.BootID)
	b = appendString(b, in.Host.Hostname)
	b = appendU64(b, uint64(in.Lease.Milliseconds()))
	b = appendString(b, in.Shm.Path)
	b = appendU64(b, uint64(in.Shm.Size))
	b = appendU64(b, uint64(in.Shm.BlocksOffset))
	b = appendU64(b, uint64(in.Shm.GenerationsOffset))
	b = appendU64(b, in.Shm.Dev)
	b = appendU64(b, in.Shm.Inode)
	b = appendU32(b, uint32(in.Pid))
	b = appendU64(b, in.Generation)
	var clk uint64
	if !in.Clock.IsZero() {
		clk = uint64(in.Clock.UnixNano())
	}
	b = appendU64(b, clk)
	b = appendString(b, in.Kernels)
	return b
}

// decodeInfo decodes a HELLO or HELLO_ACK payload. Trailing bytes are
// ignored: they are fields a later minor revision appended.
func decodeInfo(p []byte) (Info, error) {
	d := decoder{b: p}
	var in Info
	in.EngineID = d.str("engine id")
	in.ModelFingerprint = d.str("model fingerprint")
	in.KVDType = d.str("kv dtype")
	in.Layers = int(d.u32("layers"))
	in.KVHeads = int(d.u32("kv heads"))
	in.HeadDim = int(d.u32("head dim"))
	in.BlockSize = int(d.u32("block size"))
	bb := d.u64("block bytes")
	in.NumBlocks = int(d.u32("num blocks"))
	in.Host.BootID = d.str("boot id")
	in.Host.Hostname = d.str("hostname")
	lease := d.u64("lease")
	in.Shm.Path = d.str("shm path")
	size := d.u64("shm size")
	bo := d.u64("shm blocks offset")
	gof := d.u64("shm generations offset")
	in.Shm.Dev = d.u64("shm dev")
	in.Shm.Inode = d.u64("shm inode")
	in.Pid = int(d.u32("pid"))
	in.Generation = d.u64("generation")
	if clk := d.u64("clock"); clk != 0 && clk <= math.MaxInt64 {
		in.Clock = time.Unix(0, int64(clk))
	}
	if d.err == nil && len(d.b) > 0 { // appended in a later revision
		in.Kernels = d.str("kernels")
	}
	if d.err != nil {
		return Info{}, d.err
	}
	const maxI64 = math.MaxInt64
	if bb == 0 || bb > math.MaxUint32 || lease > maxI64/uint64(time.Millisecond) || size > maxI64 || bo > maxI64 || gof > maxI64 {
		return Info{}, fmt.Errorf("%w: handshake field out of range (block bytes %d, lease %d, shm size %d, offsets %d/%d)", errBadFrame, bb, lease, size, bo, gof)
	}
	in.BlockBytes = int(bb)
	in.Lease = time.Duration(lease) * time.Millisecond
	in.Shm.Size, in.Shm.BlocksOffset, in.Shm.GenerationsOffset = int64(size), int64(bo), int64(gof)
	return in, nil
}

// blockRequest is the payload of READ and SHM_READ.
type blockRequest struct {
	RequestID string
	Blocks    []int
}

func appendBlockRequest(b []byte, r *blockRequest) []byte {
	b = appendString(b, r.RequestID)
	b = appendU32(b, uint32(len(r.Blocks)))
	for _, id := range r.Blocks {
		b = appendU32(b, uint32(id))
	}
	return b
}

func decodeBlockRequest(p []byte) (blockRequest, error) {
	d := decoder{b: p}
	var r blockRequest
	r.RequestID = d.str("request id")
	n := d.count(4, "block ids")
	if d.err == nil {
		r.Blocks = make([]int, n)
		for i := range r.Blocks {
			r.Blocks[i] = int(d.u32("block id"))
		}
	}
	return r, d.err
}

func appendGens(b []byte, gens []uint64) []byte {
	b = appendU32(b, uint32(len(gens)))
	for _, g := range gens {
		b = appendU64(b, g)
	}
	return b
}

func decodeGens(p []byte) ([]uint64, error) {
	d := decoder{b: p}
	n := d.count(8, "generations")
	if d.err != nil {
		return nil, d.err
	}
	g := make([]uint64, n)
	for i := range g {
		g[i] = d.u64("generation")
	}
	return g, d.err
}

// appendIDs encodes a list of request ids (HEARTBEAT, ACK).
func appendIDs(b []byte, ids []string) []byte {
	b = appendU32(b, uint32(len(ids)))
	for _, id := range ids {
		b = appendString(b, id)
	}
	return b
}

func decodeIDs(p []byte) ([]string, error) {
	d := decoder{b: p}
	n := d.count(2, "request ids") // each id takes at least its u16 length
	if d.err != nil {
		return nil, d.err
	}
	ids := make([]string, 0, n)
	for range n {
		ids = append(ids, d.str("request id"))
	}
	return ids, d.err
}

func decodeDone(p []byte) (string, error) {
	d := decoder{b: p}
	id := d.str("request id")
	return id, d.err
}
