package kvcache

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

func open(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func attach(t *testing.T, p *Pool) *Attached {
	t.Helper()
	a, err := Attach(open(t, p.Path()), p.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	})
	return a
}

func TestAttach(t *testing.T) {
	t.Run("an attached reader sees the owner's bytes and generations", func(t *testing.T) {
		p := newMemfdPool(t, 3)
		ids, _ := p.Allocate(2)
		copy(p.BlockBytes(ids[1]), "hello")
		p.Data()[p.Layout().Offset(int(ids[0]), 1, 1, 3)*p.Layout().ElemBytes()] = 0x25
		a := attach(t, p)
		if a.Layout() != p.Layout() || a.NumBlocks() != 3 || a.Geometry() != p.Geometry() {
			t.Errorf("attached geometry %+v, want %+v", a.Geometry(), p.Geometry())
		}
		if !a.Sealed() {
			t.Error("an engine's memory file is not reported sealed")
		}
		b, err := a.BlockBytes(ids[1])
		if err != nil || string(b[:5]) != "hello" {
			t.Errorf("attached block = %q, %v; want hello", b[:5], err)
		}
		b0, _ := a.BlockBytes(ids[0])
		if b0[p.Layout().Offset(0, 1, 1, 3)*p.Layout().ElemBytes()] != 0x25 {
			t.Error("a byte written through Data() is not seen in the attached block")
		}
		if g, _ := a.Generation(ids[0]); g != 1 {
			t.Errorf("attached generation = %d, want 1", g)
		}
		p.Free(ids)
		p.Allocate(3) // reuses both blocks
		if g, _ := a.Generation(ids[0]); g != 2 {
			t.Errorf("generation after reuse = %d, want 2: a racing reader could not tell", g)
		}
		for _, id := range []int32{3, -1} {
			if _, err := a.BlockBytes(id); err == nil {
				t.Errorf("BlockBytes(%d) out of range gave no error", id)
			}
			if _, err := a.Generation(id); err == nil {
				t.Errorf("Generation(%d) out of range gave no error", id)
			}
		}
	})
	t.Run("the view outlives the file and the owner's descriptor", func(t *testing.T) {
		p, err := New(Config{Layout: testLayout, NumBlocks: 2})
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := p.Allocate(1)
		copy(p.BlockBytes(ids[0]), "kept")
		f := open(t, p.Path())
		a, err := Attach(f, p.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		p.Close()
		b, err := a.BlockBytes(ids[0])
		if err != nil || string(b[:4]) != "kept" {
			t.Errorf("block after the owner closed = %q, %v", b[:4], err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.BlockBytes(ids[0]); err == nil {
			t.Error("BlockBytes after Close gave no error")
		}
	})
	t.Run("a named pool file attaches but is not sealed", func(t *testing.T) {
		if a := attach(t, newPool(t, 2)); a.Sealed() {
			t.Error("a named file reported sealed")
		}
	})
}

// TestAttachHostile feeds Attach files that lie about what they hold or are
// cut short. None may be mapped.
func TestAttachHostile(t *testing.T) {
	g, err := geometryFor(testLayout, 3)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	put32 := func(off int, v uint32) func([]byte) { return func(h []byte) { le.PutUint32(h[off:], v) } }
	put64 := func(off int, v uint64) func([]byte) { return func(h []byte) { le.PutUint64(h[off:], v) } }
	tests := []struct {
		name    string
		edit    func(hdr []byte) // changes a valid header
		size    int64            // file size; 0 means the geometry's
		want    Geometry         // zero means g
		wantErr string
	}{
		{name: "an empty file", edit: func(h []byte) { clear(h) }, size: -1, wantErr: "too short for a header"},
		{name: "a file shorter than a header", size: 100, wantErr: "too short for a header"},
		{name: "zeros", edit: func(h []byte) { clear(h) }, wantErr: "not a Tandem KV pool"},
		{name: "another version", edit: put32(offVersion, 1), wantErr: "header version 1"},
		{name: "a pool cut short in its blocks", size: headerSize + 10, wantErr: "truncated"},
		{name: "a pool cut short in its generations", size: g.Size - 8, wantErr: "truncated"},
		{name: "a pool with trailing bytes", size: g.Size + 4096, wantErr: "describes"},
		{name: "more blocks than the file holds", edit: put64(offNumBlocks, 4), wantErr: "inconsistent header"},
		{name: "zero blocks", edit: put64(offNumBlocks, 0), wantErr: "0 blocks"},
		{name: "a block count past int32 ids", edit: put64(offNumBlocks, 1<<40), wantErr: "blocks: want 1 to"},
		{name: "bigger blocks than the layout has", edit: put64(offBlockBytes, uint64(g.BlockBytes)*2), wantErr: "inconsistent header"},
		{name: "blocks at another offset", edit: put64(offDataOffset, 0), wantErr: "inconsistent header"},
		{name: "generations past the end", edit: put64(offGenOffset, uint64(g.Size)), wantErr: "inconsistent header"},
		{name: "misaligned generations", edit: put64(offGenOffset, uint64(g.GenerationsOffset)+4), wantErr: "inconsistent header"},
		{name: "more layers than the file holds", edit: put32(offLayers, 4), wantErr: "inconsistent header"},
		{name: "zero layers", edit: put32(offLayers, 0), wantErr: "invalid KV layout"},
		{name: "a huge block that still fits in 64 bits", edit: put32(offLayers, 1<<31), wantErr: "inconsistent header"},
		{name: "layers and head dim whose product overflows 64 bits", edit: func(h []byte) {
			le.PutUint32(h[offLayers:], 1<<31)
			le.PutUint32(h[offHeadDim:], 1<<31)
		}, wantErr: "more than"},
		{name: "every dimension at its maximum", edit: func(h []byte) {
			for _, off := range []int{offBlockSize, offLayers, offKVHeads, offHeadDim} {
				le.PutUint32(h[off:], 1<<32-1)
			}
		}, wantErr: "more than"},
		{name: "an unknown element type", edit: put32(offDType, 2), wantErr: "unknown KV element type 2"},
		{name: "an element type that truncates to f32", edit: put32(offDType, 0x100), wantErr: "unknown KV element type 256"},
		{name: "a consistent file that is not the pool described", want: Geometry{Layout: kvlayout.Layout{BlockSize: 4, Layers: 2, KVHeads: 1, HeadDim: 2, DType: kvlayout.F32}, NumBlocks: 3}, wantErr: "not the pool its owner announced"},
		{name: "a file described with no geometry at all", want: Geometry{NumBlocks: -1}, wantErr: "not the pool its owner announced"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.size
			switch size {
			case 0:
				size = g.Size
			case -1:
				size = 0
			}
			hdr := make([]byte, headerSize)
			writeHeader(hdr, g)
			if tc.edit != nil {
				tc.edit(hdr)
			}
			path := filepath.Join(t.TempDir(), "pool")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(hdr[:min(int64(len(hdr)), size)], 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			want := tc.want
			if want == (Geometry{}) {
				want = g
			}
			a, err := Attach(open(t, path), want)
			if err == nil {
				a.Close()
				t.Fatalf("Attach accepted it")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Attach error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	t.Run("a directory", func(t *testing.T) {
		if _, err := Attach(open(t, t.TempDir()), g); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Attach(directory) error = %v", err)
		}
	})
	t.Run("the unchanged header attaches (the cases above differ from it only as named)", func(t *testing.T) {
		hdr := make([]byte, headerSize)
		writeHeader(hdr, g)
		path := filepath.Join(t.TempDir(), "pool")
		if err := os.WriteFile(path, append(hdr, make([]byte, g.Size-headerSize)...), 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := Attach(open(t, path), g)
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
	})
}

// FuzzParseHeader checks that whatever a header says, a geometry that
// parses keeps every block and every generation counter inside the file, so
// indexing an Attached view can never leave the mapping.
func FuzzParseHeader(f *testing.F) {
	for _, l := range []kvlayout.Layout{testLayout, {BlockSize: 16, Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvlayout.BF16}} {
		for _, n := range []int{1, 3, 1000} {
			g, err := geometryFor(l, n)
			if err != nil {
				f.Fatal(err)
			}
			hdr := make([]byte, headerSize)
			writeHeader(hdr, g)
			f.Add(hdr[:64], g.Size)
			f.Add(hdr[:64], g.Size-1)
		}
	}
	f.Fuzz(func(t *testing.T, head []byte, size int64) {
		hdr := make([]byte, headerSize)
		copy(hdr, head)
		g, err := parseHeader(hdr, size)
		if err != nil {
			return
		}
		n, bb := int64(g.NumBlocks), int64(g.BlockBytes)
		switch {
		case g.Size != size:
			t.Fatalf("accepted %+v for a file of %d bytes", g, size)
		case n <= 0 || n > maxBlocks || bb <= 0 || bb != int64(g.Layout.BlockBytes()):
			t.Fatalf("accepted %d blocks of %d bytes (layout %+v)", n, bb, g.Layout)
		case g.BlocksOffset != headerSize || g.BlocksOffset+n*bb > g.GenerationsOffset:
			t.Fatalf("accepted blocks [%d, %d) overlapping the header or the generations at %d", g.BlocksOffset, g.BlocksOffset+n*bb, g.GenerationsOffset)
		case g.GenerationsOffset%8 != 0 || g.GenerationsOffset+8*n != g.Size:
			t.Fatalf("accepted generations at %d for %d blocks in %d bytes", g.GenerationsOffset, n, g.Size)
		}
	})
}
