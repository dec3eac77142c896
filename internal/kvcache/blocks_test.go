package kvcache

import (
	"errors"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// These tests exercise the accounting alone: no file, no mapping.

func newBlocks(t *testing.T, n int) *Blocks {
	t.Helper()
	b, err := NewBlocks(BlocksConfig{BlockSize: 4, NumBlocks: n, ExtraKey: "model-a"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func alloc(t *testing.T, b *Blocks, n int) []int32 {
	t.Helper()
	ids, ok := b.Allocate(n)
	if !ok {
		t.Fatalf("Allocate(%d) failed with %d free", n, b.FreeBlocks())
	}
	return ids
}

func free(t *testing.T, b *Blocks, ids ...int32) {
	t.Helper()
	if err := b.Free(ids); err != nil {
		t.Fatal(err)
	}
}

func TestBlocksIsPureAccounting(t *testing.T) {
	// The scheduler's tests run on Blocks alone; keep it free of files,
	// mappings, unsafe memory and anything else with side effects.
	allowed := map[string]bool{"crypto/sha256": true, "encoding/binary": true, "errors": true, "fmt": true}
	f, err := parser.ParseFile(token.NewFileSet(), "blocks.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if !allowed[path] {
			t.Errorf("blocks.go imports %q: the accounting must not touch memory, files or the clock", path)
		}
	}
}

func TestNewBlocks(t *testing.T) {
	tests := []struct {
		name    string
		cfg     BlocksConfig
		wantErr string
	}{
		{"a positive size is accepted", BlocksConfig{BlockSize: 16, NumBlocks: 3}, ""},
		{"a zero block size is refused", BlocksConfig{NumBlocks: 3}, "block size"},
		{"no blocks is refused", BlocksConfig{BlockSize: 16}, "0 blocks"},
		{"more blocks than int32 ids is refused", BlocksConfig{BlockSize: 16, NumBlocks: 1 << 31}, "int32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBlocks(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewBlocks error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.NumBlocks() != tc.cfg.NumBlocks || b.FreeBlocks() != tc.cfg.NumBlocks || b.BlockSize() != tc.cfg.BlockSize {
				t.Errorf("NumBlocks %d FreeBlocks %d BlockSize %d, want %d, %d, %d", b.NumBlocks(), b.FreeBlocks(), b.BlockSize(), tc.cfg.NumBlocks, tc.cfg.NumBlocks, tc.cfg.BlockSize)
			}
		})
	}
}

func TestAllocation(t *testing.T) {
	t.Run("allocation is all or nothing", func(t *testing.T) {
		b := newBlocks(t, 4)
		alloc(t, b, 3)
		if ids, ok := b.Allocate(2); ok || ids != nil {
			t.Fatalf("Allocate(2) with 1 free = %v, %v", ids, ok)
		}
		if b.FreeBlocks() != 1 {
			t.Errorf("FreeBlocks() = %d after a failed allocation, want 1", b.FreeBlocks())
		}
		if got := b.Usage(); got != 0.75 {
			t.Errorf("Usage() = %v, want 0.75", got)
		}
	})
	t.Run("freeing a block twice is reported and changes nothing", func(t *testing.T) {
		b := newBlocks(t, 2)
		ids := alloc(t, b, 1)
		free(t, b, ids...)
		if err := b.Free(ids); !errors.Is(err, ErrNotHeld) {
			t.Errorf("second Free error = %v, want ErrNotHeld", err)
		}
		if err := b.Free([]int32{-1, 9}); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Free of unknown ids error = %v, want ErrNotHeld", err)
		}
		if b.FreeBlocks() != 2 {
			t.Errorf("FreeBlocks() = %d, want 2", b.FreeBlocks())
		}
	})
	t.Run("shared blocks return to the pool with their last reference", func(t *testing.T) {
		b := newBlocks(t, 2)
		ids := alloc(t, b, 1)
		b.Touch(ids)
		free(t, b, ids...)
		if b.FreeBlocks() != 1 || b.RefCount(ids[0]) != 1 {
			t.Fatalf("after one of two frees: free %d ref %d", b.FreeBlocks(), b.RefCount(ids[0]))
		}
		free(t, b, ids...)
		if b.FreeBlocks() != 2 {
			t.Errorf("FreeBlocks() = %d, want 2", b.FreeBlocks())
		}
	})
	t.Run("OnAllocate sees exactly the blocks taken for new content, before they are returned", func(t *testing.T) {
		var seen [][]int32
		var b *Blocks
		b, err := NewBlocks(BlocksConfig{BlockSize: 4, NumBlocks: 3, OnAllocate: func(ids []int32) {
			for _, id := range ids {
				if b.RefCount(id) != 1 {
					t.Errorf("OnAllocate(%v): block %d has %d references, want the one Allocate took", ids, id, b.RefCount(id))
				}
			}
			seen = append(seen, append([]int32(nil), ids...))
		}})
		if err != nil {
			t.Fatal(err)
		}
		first := alloc(t, b, 2)
		b.Touch(first[:1]) // a cache hit keeps its content: no call
		alloc(t, b, 0)     // nothing taken: no call
		b.Allocate(5)      // refused: no call
		free(t, b, first...)
		free(t, b, first[0])
		second := alloc(t, b, 3)
		if diff := cmp.Diff([][]int32{first, second}, seen); diff != "" {
			t.Errorf("OnAllocate calls (-want +got):\n%s", diff)
		}
	})
}

func TestPrefixCache(t *testing.T) {
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	t.Run("full computed blocks are found by a later prompt sharing them", func(t *testing.T) {
		b := newBlocks(t, 4)
		hashes := b.ExtendHashes(nil, tokens)
		if len(hashes) != 2 {
			t.Fatalf("%d hashes for 10 tokens in blocks of 4, want 2", len(hashes))
		}
		ids := alloc(t, b, 3)
		for i, h := range hashes {
			if !b.Cache(ids[i], h) {
				t.Fatalf("Cache(%d) refused", ids[i])
			}
		}
		free(t, b, ids...)
		if b.FreeBlocks() != 4 {
			t.Fatalf("cached blocks must count as free: FreeBlocks() = %d", b.FreeBlocks())
		}
		other := append([]int32{1, 2, 3, 4, 5, 6, 7, 8}, 42, 43, 44, 45)
		got := b.Match(b.ExtendHashes(nil, other))
		if diff := cmp.Diff(ids[:2], got); diff != "" {
			t.Errorf("Match (-want +got):\n%s", diff)
		}
		b.Touch(got)
		if b.FreeBlocks() != 2 || b.RefCount(got[0]) != 1 {
			t.Errorf("touching cached free blocks: free %d ref %d, want 2 and 1", b.FreeBlocks(), b.RefCount(got[0]))
		}
		free(t, b, got...)
	})
	t.Run("a different first block misses even when later blocks match", func(t *testing.T) {
		b := newBlocks(t, 2)
		h := b.ExtendHashes(nil, tokens)
		ids := alloc(t, b, 2)
		b.Cache(ids[0], h[0])
		b.Cache(ids[1], h[1])
		changed := append([]int32{99}, tokens[1:]...)
		if got := b.Match(b.ExtendHashes(nil, changed)); len(got) != 0 {
			t.Errorf("Match = %v, want no hit", got)
		}
		free(t, b, ids...)
	})
	t.Run("another model's blocks never hit", func(t *testing.T) {
		b := newBlocks(t, 1)
		other, err := NewBlocks(BlocksConfig{BlockSize: 4, NumBlocks: 1, ExtraKey: "model-b"})
		if err != nil {
			t.Fatal(err)
		}
		if b.ExtendHashes(nil, tokens)[0] == other.ExtendHashes(nil, tokens)[0] {
			t.Error("same hash under two model fingerprints")
		}
	})
	t.Run("a duplicate block stays private", func(t *testing.T) {
		b := newBlocks(t, 2)
		h := b.ExtendHashes(nil, tokens)[0]
		ids := alloc(t, b, 2)
		if !b.Cache(ids[0], h) || b.Cache(ids[1], h) {
			t.Fatal("want the first Cache to win and the duplicate refused")
		}
		if b.Cache(ids[0], b.ExtendHashes(nil, tokens)[1]) {
			t.Error("a block registered twice under different hashes")
		}
		free(t, b, ids...)
		if b.NumCachedBlocks() != 1 {
			t.Errorf("NumCachedBlocks() = %d, want 1", b.NumCachedBlocks())
		}
	})
	t.Run("an uncached block is never hit again", func(t *testing.T) {
		b := newBlocks(t, 1)
		h := b.ExtendHashes(nil, tokens)[:1]
		ids := alloc(t, b, 1)
		b.Cache(ids[0], h[0])
		free(t, b, ids...)
		b.Uncache(ids[0])
		if got := b.Match(h); len(got) != 0 || b.Cached(ids[0]) {
			t.Errorf("Match after Uncache = %v", got)
		}
	})
	t.Run("query and hit counters add up", func(t *testing.T) {
		b := newBlocks(t, 1)
		b.RecordPrefixQuery(10, 8)
		b.RecordPrefixQuery(5, 0)
		if q, h := b.PrefixStats(); q != 15 || h != 8 {
			t.Errorf("PrefixStats() = %d, %d; want 15, 8", q, h)
		}
	})
}

func TestEvictionOrder(t *testing.T) {
	b := newBlocks(t, 4)
	tokens := make([]int32, 16)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	h := b.ExtendHashes(nil, tokens)
	ids := alloc(t, b, 4) // 0 1 2 3
	for i := range 3 {
		b.Cache(ids[i], h[i])
	}
	// Free 0 and 1 as one request (reverse order: 1 then 0), then 3
	// (uncached), then 2.
	free(t, b, ids[0], ids[1])
	free(t, b, ids[3])
	free(t, b, ids[2])

	got := alloc(t, b, 4)
	want := []int32{ids[3], ids[1], ids[0], ids[2]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocation order: uncached first, then least recently freed (-want +got):\n%s", diff)
	}
	if b.NumCachedBlocks() != 0 {
		t.Errorf("evicted blocks still cached: %d", b.NumCachedBlocks())
	}
	free(t, b, got...)
	if b.FreeBlocks() != 4 {
		t.Errorf("FreeBlocks() = %d, want 4", b.FreeBlocks())
	}
}

// groupEvents records what a CacheObserver sees.
type groupEvents struct{ stored, removed int }

func (e *groupEvents) BlockStored(hash, parent BlockHash, tokens []int32) { e.stored++ }
func (e *groupEvents) BlockRemoved(hash BlockHash)                        { e.removed++ }

// TestPrefixCacheByGroup checks that the prefix cache is keyed by (hash,
// KV-cache group): the same tokens cached in two groups are two blocks,
// matched and evicted each in its own group, and only group 0 is reported
// to the observer.
func TestPrefixCacheByGroup(t *testing.T) {
	b := newBlocks(t, 4)
	ev := &groupEvents{}
	b.SetObserver(ev)
	h := b.ExtendHashes(nil, []int32{1, 2, 3, 4})
	ids := alloc(t, b, 2)
	if !b.Cache(ids[0], h[0]) || !b.CacheGroup(1, ids[1], h[0]) {
		t.Fatal("caching one hash in two groups failed")
	}
	if b.CacheGroup(1, ids[0], h[0]) {
		t.Error("a block cached twice")
	}
	if got := b.Match(h); len(got) != 1 || got[0] != ids[0] {
		t.Errorf("Match = %v, want [%d]", got, ids[0])
	}
	if got := b.MatchGroup(1, h); len(got) != 1 || got[0] != ids[1] {
		t.Errorf("MatchGroup(1) = %v, want [%d]", got, ids[1])
	}
	if _, ok := b.Lookup(2, h[0]); ok {
		t.Error("group 2 finds a block it never cached")
	}
	free(t, b, ids[1]) // group 1's block is the only cached free one left after the uncached two are taken
	alloc(t, b, 3)
	if _, ok := b.Lookup(1, h[0]); ok {
		t.Error("group 1's evicted block is still cached")
	}
	if _, ok := b.Lookup(0, h[0]); !ok {
		t.Error("group 0's held block was evicted")
	}
	if ev.stored != 1 || ev.removed != 0 {
		t.Errorf("observer saw %d stored, %d removed; want 1, 0 (group 0 only)", ev.stored, ev.removed)
	}
}
