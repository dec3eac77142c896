package sched

import (
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// checkTables fails unless every scheduled request's tables are what the
// model checks (one per group, each covering the step's tokens, no null
// entry a window still reads) and returns the most blocks any sliding
// table held.
func checkTables(t *testing.T, out *Output, windows []int) int {
	t.Helper()
	most := 0
	for _, sc := range out.Scheduled {
		if len(sc.Tables) != len(windows) {
			t.Fatalf("%s: %d tables for %d groups", sc.Req.ID, len(sc.Tables), len(windows))
		}
		if !slices.Equal(sc.Tables[0], sc.Blocks) {
			t.Fatalf("%s: Blocks is not group 0's table", sc.Req.ID)
		}
		end := sc.Pos + len(sc.Tokens)
		for g, tbl := range sc.Tables {
			if len(tbl)*bs < end {
				t.Fatalf("%s: group %d's %d blocks cannot hold %d tokens", sc.Req.ID, g, len(tbl), end)
			}
			first := kvlayout.FirstNeeded(windows[g], sc.Pos) / bs
			for i := first; i*bs < end; i++ {
				if tbl[i] == kvlayout.NullBlock {
					t.Fatalf("%s@%d: group %d's block %d is null, but window %d still reads it", sc.Req.ID, sc.Pos, g, i, windows[g])
				}
			}
			if windows[g] > 0 {
				most = max(most, len(held(tbl)))
			} else if len(held(tbl)) != len(tbl) {
				t.Fatalf("%s: full-attention group %d has a null block", sc.Req.ID, g)
			}
		}
	}
	return most
}

// TestSlidingGroupFreesBlocksAsItDecodes steps one request with a
// full-attention group and a sliding-window group (window 8, blocks of 4)
// through a prefill and 200 decodes: the full table grows to the whole
// sequence while the sliding one holds at most a key chunk and the window,
// freeing the rest as the window moves on.
func TestSlidingGroupFreesBlocksAsItDecodes(t *testing.T) {
	windows := []int{0, 8}
	h := newHarness(t, 200, Config{GroupWindows: windows}, nil)
	p := prompt(1, 10)
	r := h.add("a", p, 200)
	most, freed := 0, false
	h.check = func(out *Output) { most = max(most, checkTables(t, out, windows)) }
	for h.s.HasWork() {
		h.step()
		if tbl := r.Tables(); tbl != nil && len(held(tbl[1])) < len(tbl[1]) {
			freed = true
			if n := len(held(tbl[0])) + len(held(tbl[1])); h.pool.NumBlocks()-h.pool.FreeBlocks() != n {
				t.Fatalf("pool has %d blocks in use, the request holds %d", h.pool.NumBlocks()-h.pool.FreeBlocks(), n)
			}
		}
	}
	if !freed {
		t.Fatal("the sliding group never freed a block")
	}
	// A key chunk (16 blocks) plus the window (2) plus the block being
	// written: 19, against 53 for the whole sequence.
	if limit := (kvlayout.KeyChunk+8)/bs + 1; most > limit {
		t.Errorf("sliding table held %d blocks at once, want at most %d", most, limit)
	}
	if got, w := h.finished["a"].Req.Output(), want(p, 200); !slices.Equal(got, w) {
		t.Errorf("output %v, want %v", got, w)
	}
}

// TestSlidingPrefixHitNeedsWindow checks vLLM's find_longest_cache_hit: a
// prefix hit reaches as far as every full-attention group has the whole
// prefix and every sliding-window group the blocks its window sees from
// the hit's end; a window block missing cuts the hit to a shorter prefix
// whose window is whole, with null entries before that window.
func TestSlidingPrefixHitNeedsWindow(t *testing.T) {
	windows := []int{0, 8}
	h := newHarness(t, 200, Config{GroupWindows: windows}, nil)
	var cTable []int32 // c's sliding table when first scheduled
	h.check = func(out *Output) {
		checkTables(t, out, windows)
		for _, sc := range out.Scheduled {
			if sc.Req.ID == "c" && cTable == nil {
				cTable = slices.Clone(sc.Tables[1])
			}
		}
	}
	a := prompt(2, 140) // 35 full blocks, all cached in both groups
	h.add("a", a, 1)
	h.runAll(100)

	b := append(slices.Clone(a), prompt(3, 20)...)
	rb := h.add("b", b, 1)
	h.step()
	if got := rb.NumCachedTokens(); got != 140 {
		t.Fatalf("b hit %d tokens, want 140 (the window from 140 reads blocks 32-34, all cached)", got)
	}
	h.runAll(100)

	// Drop group 1's block 33: a hit of 35 blocks misses it in its
	// window, so the hit ends at 33, whose window (from position 64,
	// block 16) is whole.
	hashes := kvcache.BlockHashes("", bs, nil, a)
	id, ok := h.pool.Lookup(1, hashes[33])
	if !ok {
		t.Fatal("group 1 does not cache block 33 of a")
	}
	h.pool.Uncache(id)
	rc := h.add("c", slices.Clone(b), 1)
	h.step()
	if got := rc.NumCachedTokens(); got != 33*bs {
		t.Fatalf("c hit %d tokens, want %d", got, 33*bs)
	}
	tbl := cTable
	if first := kvlayout.FirstNeeded(8, 33*bs) / bs; first != 16 || tbl[first-1] != kvlayout.NullBlock || tbl[first] == kvlayout.NullBlock {
		t.Errorf("c's sliding table %v: want null entries before block %d only", tbl[:34], first)
	}
	h.runAll(100)
	if got, w := h.finished["c"].Req.Output(), want(b, 1); !slices.Equal(got, w) {
		t.Errorf("c output %v, want %v", got, w)
	}
}

// TestSlidingGroupSizing checks that a request whose whole sequence in
// every group would not fit the pool is admitted and served when its
// sliding-window group needs only its window.
func TestSlidingGroupSizing(t *testing.T) {
	windows := []int{0, 8}
	cfg := Config{GroupWindows: windows, MaxNumBatchedTokens: 16}
	h := newHarness(t, 70, cfg, nil)
	h.check = func(out *Output) { checkTables(t, out, windows) }
	p := prompt(4, 100)
	h.add("long", p, 60) // 159 tokens: 40 blocks a group, 80 without sliding
	h.runAll(400)
	f := h.finished["long"]
	if f.Status != FinishedLength {
		t.Fatalf("long finished %v (%s), want FINISHED_LENGTH", f.Status, f.Err)
	}
	if got, w := f.Req.Output(), want(p, 60); !slices.Equal(got, w) {
		t.Errorf("output differs from running alone")
	}
	// One full-attention group of 70 blocks: the same request cannot fit.
	h2 := newHarness(t, 70, Config{GroupWindows: []int{0, 0}, MaxNumBatchedTokens: 16}, nil)
	h2.add("long", p, 60)
	h2.step()
	if f := h2.finished["long"]; f.Status != FinishedError {
		t.Errorf("two full groups: long finished %v, want FINISHED_ERROR (80 blocks > 70)", f.Status)
	}
}

// TestSlidingLoadAllocatesWindowOnly checks that an asynchronous KV load
// (a decode leg pulling a 140-token prompt but its last token) gets blocks
// in a sliding-window group only for what the window reads from the first
// token it computes: the rest of that table is null, and the connector
// sees every group's table.
func TestSlidingLoadAllocatesWindowOnly(t *testing.T) {
	windows := []int{0, 8}
	conn := newTestConnector()
	h := newHarness(t, 200, Config{GroupWindows: windows}, conn)
	h.check = func(out *Output) { checkTables(t, out, windows) }
	p := prompt(5, 140)
	conn.offer["d"], conn.async["d"], conn.once["d"] = len(p)-1, true, true
	r := h.add("d", p, 3)
	h.step()
	if r.Status() != WaitingForRemoteKVs {
		t.Fatalf("d is %v, want loading", r.Status())
	}
	tbl := r.Tables()
	first := kvlayout.FirstNeeded(8, len(p)-1) / bs // 128/4 = 32
	if len(tbl) != 2 || len(held(tbl[0])) != 35 || len(held(tbl[1])) != 35-first || tbl[1][first-1] != kvlayout.NullBlock {
		t.Fatalf("tables %v: want 35 blocks in the full group and %d (from block %d) in the sliding one", tbl, 35-first, first)
	}
	if used := h.pool.NumBlocks() - h.pool.FreeBlocks(); used != 35+35-first {
		t.Errorf("%d blocks in use, want %d", used, 35+35-first)
	}
	h.s.UpdateFromConnector([]string{"d"}, nil, nil)
	h.runAll(20)
	if got, w := h.finished["d"].Req.Output(), want(p, 3); !slices.Equal(got, w) {
		t.Errorf("output %v, want %v", got, w)
	}
}
