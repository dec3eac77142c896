package kvcache

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/tensor"
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
	offDType      = 28 // uint32: tensor.DType of the elements (version 2)
	offNumBlocks  = 32 // uint64
	offBlockBytes = 40 // uint64
	offDataOffset = 48 // uint64
	offGenOffset  = 56 // uint64
)

// mapping is a pool file mapped into memory.
type mapping struct {
	path   string
	file   *os.File // the anonymous memory file, kept open for its /proc path; nil for named files
	mem    []byte
	layout model.KVLayout
	n      int
	data   []byte   // the block region
	gens   []uint64 // one generation counter per block, in the mapping
}

// fileSize returns the size of a pool file of n blocks and the offset of its
// generation region.
func fileSize(layout model.KVLayout, n int) (size, genOff int64) {
	genOff = headerSize + int64(n)*int64(layout.BlockBytes())
	genOff = (genOff + 63) &^ 63 // 8-byte alignment is what atomics need; 64 keeps it on its own cache line
	return genOff + 8*int64(n), genOff
}

// createMapping creates, sizes and maps a new pool file. With dir empty the
// file is an anonymous memory file (memfd): it has no name anywhere, so it
// cannot outlive the process even when the process is killed with SIGKILL,
// and other processes of the same user open it as /proc/<pid>/fd/<fd> while
// this process keeps it open. With dir set, the file is created there under a
// random name and removed at Close (a SIGKILL leaves it behind).
func createMapping(dir string, layout model.KVLayout, n int) (*mapping, error) {
	size, genOff := fileSize(layout, n)
	var (
		f    *os.File
		path string
		keep *os.File
	)
	if dir == "" {
		fd, err := unix.MemfdCreate("tandem-kv", unix.MFD_CLOEXEC)
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
	fail := func(err error) (*mapping, error) {
		if keep != nil {
			keep.Close()
		} else {
			os.Remove(path)
		}
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		return fail(fmt.Errorf("kvcache: size the pool file to %d bytes: %w (lower --num-blocks or --kv-cache-memory)", size, err))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("kvcache: map the pool file (%d bytes): %w", size, err))
	}
	copy(mem[offMagic:], headerMagic)
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], headerVersion)
	le.PutUint32(mem[offBlockSize:], uint32(layout.BlockSize))
	le.PutUint32(mem[offLayers:], uint32(layout.Layers))
	le.PutUint32(mem[offKVHeads:], uint32(layout.KVHeads))
	le.PutUint32(mem[offHeadDim:], uint32(layout.HeadDim))
	le.PutUint32(mem[offDType:], uint32(layout.DType))
	le.PutUint64(mem[offNumBlocks:], uint64(n))
	le.PutUint64(mem[offBlockBytes:], uint64(layout.BlockBytes()))
	le.PutUint64(mem[offDataOffset:], headerSize)
	le.PutUint64(mem[offGenOffset:], uint64(genOff))
	m := newMapping(path, mem, layout, n, genOff)
	m.file = keep
	return m, nil
}

func newMapping(path string, mem []byte, layout model.KVLayout, n int, genOff int64) *mapping {
	m := &mapping{path: path, mem: mem, layout: layout, n: n}
	m.data = mem[headerSize : headerSize+int64(n)*int64(layout.BlockBytes())]
	if n > 0 {
		m.gens = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[genOff])), n)
	}
	return m
}

func (m *mapping) blockBytes(id int32) []byte {
	bb := m.layout.BlockBytes()
	return m.data[int(id)*bb : (int(id)+1)*bb : (int(id)+1)*bb]
}

func (m *mapping) generation(id int32) uint64 { return atomic.LoadUint64(&m.gens[id]) }

func (m *mapping) close(unlink bool) error {
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
	} else if unlink {
		if rerr := os.Remove(m.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		return fmt.Errorf("kvcache: close pool file %s: %w", m.path, err)
	}
	return nil
}

// Attached is a read-only view of another engine's pool file on this host,
// for the same-host transfer path: the reader copies blocks straight out of
// the owner's memory and checks their generations around the copy.
type Attached struct {
	m *mapping
}

// Attach maps the pool file at path read-only and checks its header. The
// owner may unlink the file after Attach returns; the mapping stays valid
// until Close.
func Attach(path string) (*Attached, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kvcache: attach pool: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvcache: attach pool %s: %w", path, err)
	}
	if st.Size() < headerSize {
		return nil, fmt.Errorf("kvcache: attach pool %s: file of %d bytes is too short for a header", path, st.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvcache: map pool %s: %w", path, err)
	}
	le := binary.LittleEndian
	fail := func(format string, args ...any) (*Attached, error) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("kvcache: attach pool %s: "+format, append([]any{path}, args...)...)
	}
	if string(mem[offMagic:offMagic+8]) != headerMagic {
		return fail("not a Tandem KV pool file")
	}
	if v := le.Uint32(mem[offVersion:]); v != headerVersion {
		return fail("header version %d, this build reads version %d: run the same Tandem version on both engines", v, headerVersion)
	}
	layout := model.KVLayout{
		BlockSize: int(le.Uint32(mem[offBlockSize:])),
		Layers:    int(le.Uint32(mem[offLayers:])),
		KVHeads:   int(le.Uint32(mem[offKVHeads:])),
		HeadDim:   int(le.Uint32(mem[offHeadDim:])),
		DType:     tensor.DType(le.Uint32(mem[offDType:])),
	}
	if layout.DType != tensor.F32 && layout.DType != tensor.BF16 {
		return fail("unknown KV element type %d", layout.DType)
	}
	n := int(le.Uint64(mem[offNumBlocks:]))
	size, genOff := fileSize(layout, n)
	if le.Uint64(mem[offBlockBytes:]) != uint64(layout.BlockBytes()) || le.Uint64(mem[offDataOffset:]) != headerSize ||
		le.Uint64(mem[offGenOffset:]) != uint64(genOff) || size != st.Size() {
		return fail("inconsistent header (layout %+v, %d blocks, file %d bytes)", layout, n, st.Size())
	}
	return &Attached{m: newMapping(path, mem, layout, n, genOff)}, nil
}

// Layout returns the owner's KV layout.
func (a *Attached) Layout() model.KVLayout { return a.m.layout }

// NumBlocks returns the number of blocks in the owner's pool.
func (a *Attached) NumBlocks() int { return a.m.n }

// BlockBytes returns the bytes of block id (read-only memory: writing faults).
func (a *Attached) BlockBytes(id int32) ([]byte, error) {
	if id < 0 || int(id) >= a.m.n {
		return nil, fmt.Errorf("kvcache: block %d out of range [0, %d)", id, a.m.n)
	}
	return a.m.blockBytes(id), nil
}

// Generation returns block id's generation counter as the owner last
// published it.
func (a *Attached) Generation(id int32) (uint64, error) {
	if id < 0 || int(id) >= a.m.n {
		return 0, fmt.Errorf("kvcache: block %d out of range [0, %d)", id, a.m.n)
	}
	return a.m.generation(id), nil
}

// Close unmaps the view.
func (a *Attached) Close() error { return a.m.close(false) }
