package kvcache

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// testLayout is bf16 so that Attach is seen to read the element type back.
var testLayout = kvlayout.Layout{BlockSize: 4, Layers: 2, KVHeads: 1, HeadDim: 2, DType: kvlayout.BF16}

// newPool returns a pool in a named file under a test directory (Dir set);
// newMemfdPool one in an anonymous memory file, as engines run.
func newPool(t *testing.T, n int) *Pool {
	t.Helper()
	return newPoolIn(t, t.TempDir(), n)
}

func newMemfdPool(t *testing.T, n int) *Pool {
	t.Helper()
	return newPoolIn(t, "", n)
}

func newPoolIn(t *testing.T, dir string, n int) *Pool {
	t.Helper()
	p, err := New(Config{Layout: testLayout, NumBlocks: n, Dir: dir, ExtraKey: "model-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func TestNewSizing(t *testing.T) {
	bb := int64(testLayout.BlockBytes())
	tests := []struct {
		name    string
		cfg     Config
		want    int
		wantErr string
	}{
		{"a block count is used as is", Config{Layout: testLayout, NumBlocks: 7}, 7, ""},
		{"a byte budget is divided by the block size in bytes", Config{Layout: testLayout, MemoryBytes: 10*bb + bb/2}, 10, ""},
		{"a block count wins over a byte budget", Config{Layout: testLayout, NumBlocks: 3, MemoryBytes: 100 * bb}, 3, ""},
		{"a zero block size means the default", Config{Layout: kvlayout.Layout{Layers: 1, KVHeads: 1, HeadDim: 1}, NumBlocks: 1}, 1, ""},
		{"a budget smaller than one block is an error", Config{Layout: testLayout, MemoryBytes: bb - 1}, 0, "hold no block"},
		{"no size at all is an error", Config{Layout: testLayout}, 0, "positive number"},
		{"a layout without heads is an error", Config{Layout: kvlayout.Layout{BlockSize: 4, Layers: 1, HeadDim: 2}, NumBlocks: 1}, 0, "invalid KV layout"},
		{"an element type other than f32 or bf16 is an error", Config{Layout: kvlayout.Layout{BlockSize: 4, Layers: 1, KVHeads: 1, HeadDim: 2, DType: kvlayout.ElemType(2)}, NumBlocks: 1}, 0, "neither f32 nor bf16"},
		{"a layout past any memory is an error", Config{Layout: kvlayout.Layout{BlockSize: 1 << 20, Layers: 1 << 20, KVHeads: 1 << 20, HeadDim: 1}, NumBlocks: 1}, 0, "more than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Dir = t.TempDir()
			p, err := New(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.NumBlocks() != tc.want || p.FreeBlocks() != tc.want || p.Memory.NumBlocks() != tc.want {
				t.Errorf("NumBlocks %d FreeBlocks %d Memory.NumBlocks %d, want %d", p.NumBlocks(), p.FreeBlocks(), p.Memory.NumBlocks(), tc.want)
			}
			if got, want := len(p.Data()), tc.want*p.Layout().BlockBytes(); got != want {
				t.Errorf("len(Data()) = %d, want %d", got, want)
			}
		})
	}
	t.Run("the default block size is 16", func(t *testing.T) {
		p, err := New(Config{Layout: kvlayout.Layout{Layers: 1, KVHeads: 1, HeadDim: 1}, NumBlocks: 1, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.BlockSize() != DefaultBlockSize || p.Layout().BlockSize != DefaultBlockSize {
			t.Errorf("BlockSize() = %d, Layout().BlockSize %d, want %d", p.BlockSize(), p.Layout().BlockSize, DefaultBlockSize)
		}
	})
}

func TestSharedFile(t *testing.T) {
	t.Run("the pool is an anonymous memory file, reachable through /proc while open", func(t *testing.T) {
		p, err := New(Config{Layout: testLayout, NumBlocks: 2})
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("/proc/%d/fd/", os.Getpid()); !strings.HasPrefix(p.Path(), want) {
			t.Errorf("Path() = %q, want %s<fd>", p.Path(), want)
		}
		target, err := os.Readlink(p.Path())
		if err != nil || !strings.HasPrefix(target, "/memfd:tandem-kv") {
			t.Errorf("pool file is %q (%v), want an anonymous memory file", target, err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p.Path()); err == nil {
			t.Errorf("pool file still reachable after Close")
		}
	})
	t.Run("the memory file's size is sealed, so no reader's mapping can lose pages", func(t *testing.T) {
		p := newMemfdPool(t, 2)
		f, err := os.OpenFile(p.Path(), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(4096); !errors.Is(err, syscall.EPERM) {
			t.Errorf("shrinking the pool file: %v, want EPERM", err)
		}
		if err := f.Truncate(p.Geometry().Size + 4096); !errors.Is(err, syscall.EPERM) {
			t.Errorf("growing the pool file: %v, want EPERM", err)
		}
	})
	t.Run("a pool in a named directory is removed on close", func(t *testing.T) {
		p, err := New(Config{Layout: testLayout, NumBlocks: 2, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p.Path()); err != nil {
			t.Fatalf("pool file missing while open: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pool file still there after Close: %v", err)
		}
	})
	t.Run("the file offsets are the geometry's", func(t *testing.T) {
		p := newPool(t, 3)
		g := p.Geometry()
		blocks, gens := p.FileOffsets()
		if blocks != g.BlocksOffset || gens != g.GenerationsOffset || gens%64 != 0 || blocks+3*int64(g.BlockBytes) > gens {
			t.Errorf("FileOffsets() = %d, %d for geometry %+v", blocks, gens, g)
		}
		if st, err := os.Stat(p.Path()); err != nil || st.Size() != g.Size {
			t.Errorf("pool file size %v (%v), geometry says %d", st.Size(), err, g.Size)
		}
	})
}

// TestGenerations checks the seqlock's writer half: the Pool wires the
// accounting to the memory so that every block handed out for new content
// already has a new generation when Allocate returns.
func TestGenerations(t *testing.T) {
	p := newPool(t, 4)
	tokens := make([]int32, 16)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	h := p.ExtendHashes(nil, tokens)
	ids, _ := p.Allocate(4)
	for _, id := range ids {
		if g := p.Generation(id); g != 1 {
			t.Errorf("block %d generation %d after its first allocation, want 1", id, g)
		}
	}
	for i := range 3 {
		p.Cache(ids[i], h[i])
	}
	if err := p.Free(ids); err != nil {
		t.Fatal(err)
	}
	hit := p.Match(h[:2])
	p.Touch(hit) // a prefix hit keeps the content: same generation
	for _, id := range hit {
		if g := p.Generation(id); g != 1 {
			t.Errorf("block %d generation %d after a prefix hit, want 1", id, g)
		}
	}
	got, _ := p.Allocate(2) // the uncached block 3, then cached block 2
	if diff := cmp.Diff([]int32{ids[3], ids[2]}, got); diff != "" {
		t.Errorf("allocation order (-want +got):\n%s", diff)
	}
	for _, id := range got {
		if g := p.Generation(id); g != 2 {
			t.Errorf("block %d generation %d after reuse, want 2: a racing reader could not tell", id, g)
		}
	}
	if err := p.Free(append(hit, got...)); err != nil {
		t.Fatal(err)
	}
	if p.FreeBlocks() != 4 {
		t.Errorf("FreeBlocks() = %d, want 4", p.FreeBlocks())
	}
}
