package kvcache

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// testLayout is bf16 so that Attach is seen to read the element type back.
var testLayout = model.KVLayout{BlockSize: 4, Layers: 2, KVHeads: 1, HeadDim: 2, DType: tensor.BF16}

func newPool(t *testing.T, n int) *Pool {
	t.Helper()
	p, err := New(Config{Layout: testLayout, NumBlocks: n, Dir: t.TempDir(), ExtraKey: "model-a"})
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

func alloc(t *testing.T, p *Pool, n int) []int32 {
	t.Helper()
	ids, ok := p.Allocate(n)
	if !ok {
		t.Fatalf("Allocate(%d) failed with %d free", n, p.FreeBlocks())
	}
	return ids
}

func free(t *testing.T, p *Pool, ids ...int32) {
	t.Helper()
	if err := p.Free(ids); err != nil {
		t.Fatal(err)
	}
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
		{"a zero block size means the default", Config{Layout: model.KVLayout{Layers: 1, KVHeads: 1, HeadDim: 1}, NumBlocks: 1}, 1, ""},
		{"a budget smaller than one block is an error", Config{Layout: testLayout, MemoryBytes: bb - 1}, 0, "hold no block"},
		{"no size at all is an error", Config{Layout: testLayout}, 0, "positive number"},
		{"a layout without heads is an error", Config{Layout: model.KVLayout{BlockSize: 4, Layers: 1, HeadDim: 2}, NumBlocks: 1}, 0, "invalid KV layout"},
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
			if p.NumBlocks() != tc.want || p.FreeBlocks() != tc.want {
				t.Errorf("NumBlocks %d FreeBlocks %d, want %d", p.NumBlocks(), p.FreeBlocks(), tc.want)
			}
			if got, want := len(p.Data()), tc.want*p.Layout().BlockBytes(); got != want {
				t.Errorf("len(Data()) = %d, want %d", got, want)
			}
		})
	}
	t.Run("the default block size is 16", func(t *testing.T) {
		p, err := New(Config{Layout: model.KVLayout{Layers: 1, KVHeads: 1, HeadDim: 1}, NumBlocks: 1, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.BlockSize() != DefaultBlockSize {
			t.Errorf("BlockSize() = %d, want %d", p.BlockSize(), DefaultBlockSize)
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
	t.Run("an attached reader sees the owner's bytes and generations", func(t *testing.T) {
		p := newPool(t, 3)
		ids := alloc(t, p, 2)
		copy(p.BlockBytes(ids[1]), "hello")
		p.Data()[p.Layout().Offset(int(ids[0]), 1, 1, 3)*p.Layout().ElemBytes()] = 0x25
		a, err := Attach(p.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if a.Layout() != p.Layout() || a.NumBlocks() != 3 {
			t.Errorf("attached layout %+v / %d blocks, want %+v / 3", a.Layout(), a.NumBlocks(), p.Layout())
		}
		b, err := a.BlockBytes(ids[1])
		if err != nil || string(b[:5]) != "hello" {
			t.Errorf("attached block = %q, %v; want hello", b[:5], err)
		}
		g, _ := a.Generation(ids[0])
		if g != 1 {
			t.Errorf("attached generation = %d, want 1", g)
		}
		free(t, p, ids...)
		alloc(t, p, 3) // reuses both blocks
		if g2, _ := a.Generation(ids[0]); g2 != 2 {
			t.Errorf("generation after reuse = %d, want 2: a racing reader could not tell", g2)
		}
		if _, err := a.BlockBytes(3); err == nil {
			t.Error("BlockBytes out of range gave no error")
		}
	})
	t.Run("attaching something that is not a pool file fails clearly", func(t *testing.T) {
		f := t.TempDir() + "/junk"
		if err := os.WriteFile(f, make([]byte, 8192), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Attach(f); err == nil || !strings.Contains(err.Error(), "not a Tandem KV pool") {
			t.Errorf("Attach(junk) error = %v", err)
		}
	})
}

func TestAllocation(t *testing.T) {
	t.Run("allocation is all or nothing", func(t *testing.T) {
		p := newPool(t, 4)
		alloc(t, p, 3)
		if ids, ok := p.Allocate(2); ok || ids != nil {
			t.Fatalf("Allocate(2) with 1 free = %v, %v", ids, ok)
		}
		if p.FreeBlocks() != 1 {
			t.Errorf("FreeBlocks() = %d after a failed allocation, want 1", p.FreeBlocks())
		}
		if got := p.Usage(); got != 0.75 {
			t.Errorf("Usage() = %v, want 0.75", got)
		}
	})
	t.Run("freeing a block twice is reported and changes nothing", func(t *testing.T) {
		p := newPool(t, 2)
		ids := alloc(t, p, 1)
		free(t, p, ids...)
		if err := p.Free(ids); !errors.Is(err, ErrNotHeld) {
			t.Errorf("second Free error = %v, want ErrNotHeld", err)
		}
		if err := p.Free([]int32{-1, 9}); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Free of unknown ids error = %v, want ErrNotHeld", err)
		}
		if p.FreeBlocks() != 2 {
			t.Errorf("FreeBlocks() = %d, want 2", p.FreeBlocks())
		}
	})
	t.Run("shared blocks return to the pool with their last reference", func(t *testing.T) {
		p := newPool(t, 2)
		ids := alloc(t, p, 1)
		p.Touch(ids)
		free(t, p, ids...)
		if p.FreeBlocks() != 1 || p.RefCount(ids[0]) != 1 {
			t.Fatalf("after one of two frees: free %d ref %d", p.FreeBlocks(), p.RefCount(ids[0]))
		}
		free(t, p, ids...)
		if p.FreeBlocks() != 2 {
			t.Errorf("FreeBlocks() = %d, want 2", p.FreeBlocks())
		}
	})
}

func TestPrefixCache(t *testing.T) {
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	t.Run("full computed blocks are found by a later prompt sharing them", func(t *testing.T) {
		p := newPool(t, 4)
		hashes := p.ExtendHashes(nil, tokens)
		if len(hashes) != 2 {
			t.Fatalf("%d hashes for 10 tokens in blocks of 4, want 2", len(hashes))
		}
		ids := alloc(t, p, 3)
		for i, h := range hashes {
			if !p.Cache(ids[i], h) {
				t.Fatalf("Cache(%d) refused", ids[i])
			}
		}
		free(t, p, ids...)
		if p.FreeBlocks() != 4 {
			t.Fatalf("cached blocks must count as free: FreeBlocks() = %d", p.FreeBlocks())
		}
		other := append([]int32{1, 2, 3, 4, 5, 6, 7, 8}, 42, 43, 44, 45)
		got := p.Match(p.ExtendHashes(nil, other))
		if diff := cmp.Diff(ids[:2], got); diff != "" {
			t.Errorf("Match (-want +got):\n%s", diff)
		}
		p.Touch(got)
		if p.FreeBlocks() != 2 || p.RefCount(got[0]) != 1 {
			t.Errorf("touching cached free blocks: free %d ref %d, want 2 and 1", p.FreeBlocks(), p.RefCount(got[0]))
		}
		free(t, p, got...)
	})
	t.Run("a different first block misses even when later blocks match", func(t *testing.T) {
		p := newPool(t, 2)
		h := p.ExtendHashes(nil, tokens)
		ids := alloc(t, p, 2)
		p.Cache(ids[0], h[0])
		p.Cache(ids[1], h[1])
		changed := append([]int32{99}, tokens[1:]...)
		if got := p.Match(p.ExtendHashes(nil, changed)); len(got) != 0 {
			t.Errorf("Match = %v, want no hit", got)
		}
		free(t, p, ids...)
	})
	t.Run("another model's blocks never hit", func(t *testing.T) {
		p := newPool(t, 1)
		q, err := New(Config{Layout: testLayout, NumBlocks: 1, Dir: t.TempDir(), ExtraKey: "model-b"})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		if p.ExtendHashes(nil, tokens)[0] == q.ExtendHashes(nil, tokens)[0] {
			t.Error("same hash under two model fingerprints")
		}
	})
	t.Run("a duplicate block stays private", func(t *testing.T) {
		p := newPool(t, 2)
		h := p.ExtendHashes(nil, tokens)[0]
		ids := alloc(t, p, 2)
		if !p.Cache(ids[0], h) || p.Cache(ids[1], h) {
			t.Fatal("want the first Cache to win and the duplicate refused")
		}
		if p.Cache(ids[0], p.ExtendHashes(nil, tokens)[1]) {
			t.Error("a block registered twice under different hashes")
		}
		free(t, p, ids...)
		if p.NumCachedBlocks() != 1 {
			t.Errorf("NumCachedBlocks() = %d, want 1", p.NumCachedBlocks())
		}
	})
	t.Run("an uncached block is never hit again", func(t *testing.T) {
		p := newPool(t, 1)
		h := p.ExtendHashes(nil, tokens)[:1]
		ids := alloc(t, p, 1)
		p.Cache(ids[0], h[0])
		free(t, p, ids...)
		p.Uncache(ids[0])
		if got := p.Match(h); len(got) != 0 || p.Cached(ids[0]) {
			t.Errorf("Match after Uncache = %v", got)
		}
	})
	t.Run("query and hit counters add up", func(t *testing.T) {
		p := newPool(t, 1)
		p.RecordPrefixQuery(10, 8)
		p.RecordPrefixQuery(5, 0)
		if q, h := p.PrefixStats(); q != 15 || h != 8 {
			t.Errorf("PrefixStats() = %d, %d; want 15, 8", q, h)
		}
	})
}

func TestEvictionOrder(t *testing.T) {
	p := newPool(t, 4)
	tokens := make([]int32, 16)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	h := p.ExtendHashes(nil, tokens)
	ids := alloc(t, p, 4) // 0 1 2 3
	gen := func(id int32) uint64 { return p.Generation(id) }
	for i := range 3 {
		p.Cache(ids[i], h[i])
	}
	// Free 0 and 1 as one request (reverse order: 1 then 0), then 3
	// (uncached), then 2.
	free(t, p, ids[0], ids[1])
	free(t, p, ids[3])
	free(t, p, ids[2])
	before := []uint64{gen(0), gen(1), gen(2), gen(3)}

	got := alloc(t, p, 4)
	want := []int32{ids[3], ids[1], ids[0], ids[2]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocation order: uncached first, then least recently freed (-want +got):\n%s", diff)
	}
	for i := range 4 {
		if gen(int32(i)) != before[i]+1 {
			t.Errorf("block %d generation %d, want %d: every reuse bumps it", i, gen(int32(i)), before[i]+1)
		}
	}
	if p.NumCachedBlocks() != 0 {
		t.Errorf("evicted blocks still cached: %d", p.NumCachedBlocks())
	}
	free(t, p, got...)
	if p.FreeBlocks() != 4 {
		t.Errorf("FreeBlocks() = %d, want 4", p.FreeBlocks())
	}
}
