package kvcache

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// Header layout of a pool file. All fields are little-endian.
const (
	headerMagic   = "TANDEMKV"
	headerVersion = 2
	// headerSize is the space reserved for the header. It is a page so the
	// block region starts page-aligned (float32 and SIMD alignment for free).
	headerSize = 4096

	offMagic      = 0  // [8]byte
	offVersion    = 8  // uint32
	offBlockSize  = 12 // uint32
	offLayers     = 16 // uint32
	offKVHeads    = 20 // uint32
	offHeadDim    = 24 // uint32
	offDType      = 28 // uint32: kvlayout.ElemType of the elements (version 2)
	offNumBlocks  = 32 // uint64
	offBlockBytes = 40 // uint64
	offDataOffset = 48 // uint64
	offGenOffset  = 56 // uint64
)

// maxFileSize bounds every size computed from a layout (1 PiB, far beyond
// any machine's memory), so that a header read from an untrusted file can
// never overflow the arithmetic that indexes the mapping.
const maxFileSize = 1 << 50

// Geometry is where everything lies in a pool file: the KV layout of the
// blocks, how many there are, and the offsets of the blocks and of their
// generation counters. Block i occupies [BlocksOffset + i*BlockBytes,
// +BlockBytes); its generation is the little-endian uint64 at
// GenerationsOffset + 8*i, read and written atomically. A pool file's header
// records it, and Attach checks a file against the geometry its reader was
// told about.
type Geometry struct {
	Layout            kvlayout.Layout
	NumBlocks         int
	BlockBytes        int   // always Layout.BlockBytes()
	BlocksOffset      int64 // the header's size: one page
	GenerationsOffset int64 // 64-byte aligned, after the last block
	Size              int64 // the file's size: the end of the generations
}

// geometryFor returns the geometry of a pool of n blocks of layout, or an
// error when the layout is not one a pool can hold (non-positive sizes, an
// element type other than f32 or bf16, sizes past maxFileSize).
func geometryFor(l kvlayout.Layout, n int) (Geometry, error) {
	if l.BlockSize <= 0 || l.Layers <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return Geometry{}, fmt.Errorf("invalid KV layout %+v: block size, layers, kv heads and head dim must be positive", l)
	}
	if !l.DType.Valid() {
		return Geometry{}, fmt.Errorf("invalid KV layout %+v: element type %v is neither f32 nor bf16", l, l.DType)
	}
	if n <= 0 || n > maxBlocks {
		return Geometry{}, fmt.Errorf("%d blocks: want 1 to %d (block ids are int32)", n, maxBlocks)
	}
	bb := uint64(l.ElemBytes())
	ok := true
	for _, f := range []int{l.Layers, 2, l.BlockSize, l.KVHeads, l.HeadDim} {
		var fits bool
		bb, fits = mulLimit(bb, uint64(f))
		ok = ok && fits
	}
	blocks, fits := mulLimit(bb, uint64(n))
	if !ok || !fits || blocks > maxFileSize-headerSize-64-8*uint64(n) {
		return Geometry{}, fmt.Errorf("invalid KV layout %+v: %d blocks would need more than %d bytes", l, n, uint64(maxFileSize))
	}
	genOff := int64(headerSize+blocks+63) &^ 63 // 8-byte alignment is what atomics need; 64 keeps it on its own cache line
	return Geometry{
		Layout:            l,
		NumBlocks:         n,
		BlockBytes:        int(bb),
		BlocksOffset:      headerSize,
		GenerationsOffset: genOff,
		Size:              genOff + 8*int64(n),
	}, nil
}

// mulLimit returns a*b and whether it is at most maxFileSize.
func mulLimit(a, b uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	return lo, hi == 0 && lo <= maxFileSize
}

// Memory is the bytes of a pool: one shared memory file holding a header,
// the blocks and one generation counter per block, mapped read-write. It
// knows nothing of who holds which block (that is Blocks); its only rule is
// the generation seqlock: BumpGenerations must run on a block before new
// content is written into it. All methods must be called from the owning
// goroutine, except Generation and the bytes of blocks handed to a transfer.
type Memory struct {
	path string
	file *os.File // the anonymous memory file, kept open for its /proc path; nil for named files
	geom Geometry
	mem  []byte
	data []byte          // the block region
	gens []atomic.Uint64 // one generation counter per block, in the mapping
}

// NewMemory creates, sizes and maps a pool file of numBlocks blocks of
// layout. With dir empty the file is an anonymous memory file (memfd): it
// has no name anywhere, so it cannot outlive the process even when the
// process is killed with SIGKILL, and other processes of the same user open
// it as /proc/<pid>/fd/<fd> while this process keeps it open. Its size is
// sealed, so a reader's mapping can never lose pages under it (see
// Attached.Sealed). With dir set, the file is created there under a random
// name and removed at Close (a SIGKILL leaves it behind).
func NewMemory(dir string, layout kvlayout.Layout, numBlocks int) (*Memory, error) {
	g, err := geometryFor(layout, numBlocks)
	if err != nil {
		return nil, fmt.Errorf("kvcache: %w", err)
	}
	var (
		f    *os.File
		path string
		keep *os.File
	)
	if dir == "" {
		fd, err := unix.MemfdCreate("tandem-kv", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return nil, fmt.Errorf("kvcache: create the pool's memory file: %w", err)
		}
		f = os.NewFile(uintptr(fd), "tandem-kv")
		path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
		keep = f
	} else {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, fmt.Errorf("kvcache: random file name: %w", err)
		}
		path = filepath.Join(dir, "tandem-kv-"+hex.EncodeToString(rnd[:]))
		var err error
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("kvcache: create pool file: %w", err)
		}
		defer f.Close() // the mapping outlives the descriptor
	}
	fail := func(err error) (*Memory, error) {
		if keep != nil {
			keep.Close()
		} else {
			os.Remove(path)
		}
		return nil, err
	}
	if err := f.Truncate(g.Size); err != nil {
		return fail(fmt.Errorf("kvcache: size the pool file to %d bytes: %w (lower --num-blocks or --kv-cache-memory)", g.Size, err))
	}
	if keep != nil {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			return fail(fmt.Errorf("kvcache: seal the size of the pool's memory file: %w", err))
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(g.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("kvcache: map the pool file (%d bytes): %w", g.Size, err))
	}
	writeHeader(mem, g)
	m := &Memory{path: path, file: keep, geom: g, mem: mem}
	m.data, m.gens = regions(mem, g)
	return m, nil
}

func writeHeader(mem []byte, g Geometry) {
	l := g.Layout
	copy(mem[offMagic:], headerMagic)
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], headerVersion)
	le.PutUint32(mem[offBlockSize:], uint32(l.BlockSize))
	le.PutUint32(mem[offLayers:], uint32(l.Layers))
	le.PutUint32(mem[offKVHeads:], uint32(l.KVHeads))
	le.PutUint32(mem[offHeadDim:], uint32(l.HeadDim))
	le.PutUint32(mem[offDType:], uint32(l.DType))
	le.PutUint64(mem[offNumBlocks:], uint64(g.NumBlocks))
	le.PutUint64(mem[offBlockBytes:], uint64(g.BlockBytes))
	le.PutUint64(mem[offDataOffset:], uint64(g.BlocksOffset))
	le.PutUint64(mem[offGenOffset:], uint64(g.GenerationsOffset))
}

// regions returns the block region and the generation counters of a mapping
// of g.Size bytes.
func regions(mem []byte, g Geometry) ([]byte, []atomic.Uint64) {
	data := mem[g.BlocksOffset : g.BlocksOffset+int64(g.NumBlocks)*int64(g.BlockBytes)]
	// The mapping is page-aligned and GenerationsOffset 64-byte aligned, so
	// every counter is 8-byte aligned as the atomics require.
	gens := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&mem[g.GenerationsOffset])), g.NumBlocks)
	return data, gens
}

// Close unmaps the memory and closes or unlinks the pool file. The memory
// must not be used afterwards; readers that attached keep their own mapping.
func (m *Memory) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem, m.data, m.gens = nil, nil, nil
	if m.file != nil {
		// An anonymous memory file has no name to remove: closing the last
		// descriptor (and mapping) frees it.
		err = errors.Join(err, m.file.Close())
		m.file = nil
	} else if rerr := os.Remove(m.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("kvcache: close pool file %s: %w", m.path, err)
	}
	return nil
}

// Path is the pool file's path, for a same-host reader (see Attach).
func (m *Memory) Path() string { return m.path }

// Geometry returns where the blocks and generations lie in the pool file,
// as its header records it; a same-host reader passes it to Attach.
func (m *Memory) Geometry() Geometry { return m.geom }

// FileOffsets returns where the blocks and the generation counters start in
// the pool file, for a same-host reader that maps the file itself (block i
// at blocks + i*BlockBytes, its generation the uint64 at generations + 8*i).
func (m *Memory) FileOffsets() (blocks, generations int64) {
	return m.geom.BlocksOffset, m.geom.GenerationsOffset
}

// Layout returns the KV layout of the blocks.
func (m *Memory) Layout() kvlayout.Layout { return m.geom.Layout }

// NumBlocks returns the number of blocks in the memory.
func (m *Memory) NumBlocks() int { return m.geom.NumBlocks }

// Data returns the whole block region (the pool argument of model.Forward:
// Layout().Offset indexes it in elements of Layout().DType). It starts
// page-aligned.
func (m *Memory) Data() []byte { return m.data }

// BlockBytes returns the memory of block id. It panics if id is out of range,
// like a slice index: ids come from the pool itself.
func (m *Memory) BlockBytes(id int32) []byte {
	bb := m.geom.BlockBytes
	return m.data[int(id)*bb : (int(id)+1)*bb : (int(id)+1)*bb]
}

// Generation returns how many times block id has been taken to hold new
// content. It is safe to call from any goroutine.
func (m *Memory) Generation(id int32) uint64 { return m.gens[id].Load() }

// BumpGenerations increments the generation of each block in ids. It must
// run before new content is written into those blocks: a same-host reader
// that copies a block between two generation reads then sees the change
// (the seqlock of docs/kv-transfer.md, "Shared memory"). Pool calls it from
// Blocks.Allocate through BlocksConfig.OnAllocate.
func (m *Memory) BumpGenerations(ids []int32) {
	for _, id := range ids {
		m.gens[id].Add(1)
	}
}

// Sealed reports whether the memory is an anonymous memory file whose size
// is sealed, the only kind a same-host decode engine maps (a named file
// under a directory can be truncated under its readers).
func (m *Memory) Sealed() bool { return m.file != nil }
