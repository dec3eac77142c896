package kvcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// Attached is a read-only view of another engine's pool file on this host,
// for the same-host transfer path: the reader copies blocks straight out of
// the owner's memory and checks their generations around the copy. Its
// methods may be called from any goroutine, but not concurrently with
// Close: the caller keeps the view alive while it copies.
type Attached struct {
	geom   Geometry
	sealed bool
	mem    []byte
	data   []byte
	gens   []atomic.Uint64
}

// Attach maps the pool file f read-only after checking that it is a regular
// file whose header is well formed and describes exactly want (layout,
// number of blocks, block bytes, offsets and file size: what the reader was
// told about the pool, e.g. in a handshake), and whose size is that
// geometry's. Every index into the mapping is then within the file. f is
// only read: the caller closes it, and the mapping stays valid until Close
// even after f is closed and the owner's file is gone.
//
// Attach does not decide whether f may be trusted: opening the right file
// (whose process, which descriptor) is the caller's job. A file that is not
// Sealed can still be truncated by its owner after Attach returns, and then
// reading the view faults (SIGBUS).
func Attach(f *os.File, want Geometry) (*Attached, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvcache: attach pool %s: %w", f.Name(), err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("kvcache: attach pool %s: not a regular file (%v)", f.Name(), st.Mode().Type())
	}
	if st.Size() < headerSize {
		return nil, fmt.Errorf("kvcache: attach pool %s: file of %d bytes is too short for a header", f.Name(), st.Size())
	}
	// The header is read with pread, not through the mapping: a file that
	// shrank since the Stat fails here instead of faulting.
	hdr := make([]byte, headerSize)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("kvcache: attach pool %s: read the header: %w", f.Name(), err)
	}
	g, err := parseHeader(hdr, st.Size())
	if err != nil {
		return nil, fmt.Errorf("kvcache: attach pool %s: %w", f.Name(), err)
	}
	if g != want {
		return nil, fmt.Errorf("kvcache: attach pool %s: the file holds %+v, the pool was described as %+v: not the pool its owner announced", f.Name(), g, want)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	sealed := err == nil && seals&unix.F_SEAL_SHRINK != 0
	mem, err := unix.Mmap(int(f.Fd()), 0, int(g.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvcache: attach pool %s: map read-only: %w", f.Name(), err)
	}
	a := &Attached{geom: g, sealed: sealed, mem: mem}
	a.data, a.gens = regions(mem, g)
	return a, nil
}

// parseHeader reads the geometry a pool file's header describes and checks
// that it is the one a pool of that layout and block count has, and that
// the file, of size bytes, is exactly that long. hdr is the file's first
// headerSize bytes. Nothing in it is trusted.
func parseHeader(hdr []byte, size int64) (Geometry, error) {
	if len(hdr) < headerSize {
		return Geometry{}, errors.New("header truncated")
	}
	if string(hdr[offMagic:offMagic+8]) != headerMagic {
		return Geometry{}, errors.New("not a Tandem KV pool file")
	}
	le := binary.LittleEndian
	if v := le.Uint32(hdr[offVersion:]); v != headerVersion {
		return Geometry{}, fmt.Errorf("header version %d, this build reads version %d: run the same Tandem version on both engines", v, headerVersion)
	}
	dt := le.Uint32(hdr[offDType:])
	if dt != uint32(kvlayout.F32) && dt != uint32(kvlayout.BF16) {
		return Geometry{}, fmt.Errorf("unknown KV element type %d", dt)
	}
	layout := kvlayout.Layout{
		BlockSize: int(le.Uint32(hdr[offBlockSize:])),
		Layers:    int(le.Uint32(hdr[offLayers:])),
		KVHeads:   int(le.Uint32(hdr[offKVHeads:])),
		HeadDim:   int(le.Uint32(hdr[offHeadDim:])),
		DType:     kvlayout.ElemType(dt),
	}
	n := le.Uint64(hdr[offNumBlocks:])
	if n == 0 || n > maxBlocks {
		return Geometry{}, fmt.Errorf("header says %d blocks: want 1 to %d", n, maxBlocks)
	}
	g, err := geometryFor(layout, int(n))
	if err != nil {
		return Geometry{}, fmt.Errorf("header: %w", err)
	}
	if bb, off, gen := le.Uint64(hdr[offBlockBytes:]), le.Uint64(hdr[offDataOffset:]), le.Uint64(hdr[offGenOffset:]); bb != uint64(g.BlockBytes) ||
		off != uint64(g.BlocksOffset) || gen != uint64(g.GenerationsOffset) {
		return Geometry{}, fmt.Errorf("inconsistent header: %d-byte blocks at offset %d and generations at %d, but layout %+v with %d blocks puts %d-byte blocks at %d and generations at %d",
			bb, off, gen, layout, n, g.BlockBytes, g.BlocksOffset, g.GenerationsOffset)
	}
	if size != g.Size {
		return Geometry{}, fmt.Errorf("file of %d bytes, but its header describes %d (layout %+v, %d blocks): truncated or not a pool file", size, g.Size, layout, n)
	}
	return g, nil
}

// Geometry returns the geometry of the attached file.
func (a *Attached) Geometry() Geometry { return a.geom }

// Layout returns the owner's KV layout.
func (a *Attached) Layout() kvlayout.Layout { return a.geom.Layout }

// NumBlocks returns the number of blocks in the owner's pool.
func (a *Attached) NumBlocks() int { return a.geom.NumBlocks }

// Sealed reports whether the file's size is sealed (a memfd with
// F_SEAL_SHRINK, as NewMemory creates), so that its owner cannot truncate
// it under the mapping and make a read fault.
func (a *Attached) Sealed() bool { return a.sealed }

func (a *Attached) check(id int32) error {
	if a.mem == nil {
		return errors.New("kvcache: attached pool is closed")
	}
	if id < 0 || int(id) >= a.geom.NumBlocks {
		return fmt.Errorf("kvcache: block %d out of range [0, %d)", id, a.geom.NumBlocks)
	}
	return nil
}

// BlockBytes returns the bytes of block id (read-only memory: writing
// faults). They can change under the reader: check the generation before and
// after copying them.
func (a *Attached) BlockBytes(id int32) ([]byte, error) {
	if err := a.check(id); err != nil {
		return nil, err
	}
	bb := a.geom.BlockBytes
	return a.data[int(id)*bb : (int(id)+1)*bb : (int(id)+1)*bb], nil
}

// Generation returns block id's generation counter as the owner last
// published it (an atomic load).
func (a *Attached) Generation(id int32) (uint64, error) {
	if err := a.check(id); err != nil {
		return 0, err
	}
	return a.gens[id].Load(), nil
}

// Close unmaps the view. Slices returned by BlockBytes must not be used
// afterwards.
func (a *Attached) Close() error {
	if a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem, a.data, a.gens = nil, nil, nil
	if err != nil {
		return fmt.Errorf("kvcache: unmap attached pool: %w", err)
	}
	return nil
}
