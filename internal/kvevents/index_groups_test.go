package kvevents

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// groupStored and groupRemoved are a hybrid engine's events for group g
// (window: the group's sliding window, 0 for full attention) in blocks of
// 16 tokens.
func groupStored(g, window int, hs ...uint64) Event {
	return Event{Kind: BlockStored, Hashes: hs, BlockSize: 16, Group: g, HasGroup: true, Window: window}
}

func groupRemoved(g int, hs ...uint64) Event {
	return Event{Kind: BlockRemoved, Hashes: hs, Group: g, HasGroup: true}
}

func seq(from, to uint64) []uint64 {
	var hs []uint64
	for h := from; h < to; h++ {
		hs = append(hs, h)
	}
	return hs
}

// hitOf is the one engine's hit in hits (0 when absent).
func hitOf(hits []Hit, engine string) int {
	for _, h := range hits {
		if h.Engine == engine {
			return h.Blocks
		}
	}
	return 0
}

// A hybrid engine's prefix hit is what its scheduler would use (the longest
// prefix every full group holds whole and every sliding group holds from
// its window's start on), not group 0's chain alone.
func TestIndexMatchesHybridEnginesByTheirRule(t *testing.T) {
	prompt := seq(100, 108) // 8 blocks of 16 tokens: a 32-token window at 128 reads from block 4
	tests := []struct {
		name   string
		events []Event
		want   int
	}{
		{"every group holds every block", []Event{groupStored(0, 0, seq(100, 108)...), groupStored(1, 32, seq(100, 108)...)}, 8},
		{"the sliding group lost the last block: the hit ends before it", []Event{
			groupStored(0, 0, seq(100, 108)...), groupStored(1, 32, seq(100, 108)...), groupRemoved(1, 107)}, 7},
		{"the sliding group lost blocks inside every window: no hit", []Event{
			groupStored(0, 0, seq(100, 108)...), groupStored(1, 32, seq(100, 108)...), groupRemoved(1, 101, 103, 105, 107)}, 1},
		{"the sliding group lost the blocks before its window: a whole hit", []Event{
			groupStored(0, 0, seq(100, 108)...), groupStored(1, 32, seq(100, 108)...), groupRemoved(1, seq(100, 104)...)}, 8},
		{"the full group lost a block: the hit ends there", []Event{
			groupStored(0, 0, seq(100, 108)...), groupStored(1, 32, seq(100, 108)...), groupRemoved(0, 105)}, 5},
		{"every group slides, the first blocks are gone: a whole hit", []Event{
			groupStored(0, 32, seq(100, 108)...), groupRemoved(0, seq(100, 104)...)}, 8},
		{"a group that stored nothing yet does not count", []Event{
			groupStored(0, 0, seq(100, 108)...), groupRemoved(2, 100)}, 8},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			x := NewIndex()
			x.Apply("hybrid", batch(c.events...))
			x.Apply("plain", batch(stored(seq(100, 106)...)))
			hits := x.Match(prompt, nil)
			if got := hitOf(hits, "hybrid"); got != c.want {
				t.Errorf("hybrid engine: %d blocks, want %d (hits %v)", got, c.want, hits)
			}
			if got := hitOf(hits, "plain"); got != 6 {
				t.Errorf("the plain engine beside it: %d blocks, want 6", got)
			}
			x.ClearEngine("hybrid")
			if got := hitOf(x.Match(prompt, nil), "hybrid"); got != 0 {
				t.Errorf("after a clear: %d blocks", got)
			}
			x.RemoveEngine("hybrid")
			x.Apply("hybrid", batch(stored(seq(100, 103)...)))
			if got := hitOf(x.Match(prompt, nil), "hybrid"); got != 3 {
				t.Errorf("removed, then back with one group: %d blocks, want 3", got)
			}
		})
	}
}

// findLongestCacheHit is the engines' rule by its definition: the largest
// k such that every full group holds blocks 0..k−1 and every sliding group
// those its window needs: for Tandem from FirstNeeded(window, k·bs)/bs to
// k−1, for vLLM the last ⌈(window−1)/bs⌉ before k.
func findLongestCacheHit(vllm bool, windows []int, held []map[uint64]bool, bs int, hashes []uint64) int {
	for k := len(hashes); k > 0; k-- {
		ok := true
		for g, w := range windows {
			first := 0
			switch {
			case w > 0 && vllm:
				first = max(0, k-(w-1+bs-1)/bs)
			case w > 0:
				first = kvlayout.FirstNeeded(w, k*bs) / bs
			}
			for j := first; j < k && ok; j++ {
				ok = held[g][hashes[j]]
			}
		}
		if ok {
			return k
		}
	}
	return 0
}

func TestIndexHybridHitAgreesWithTheDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 1000 {
		vllm := trial%2 == 1
		windows := []int{0, 16 * (1 + rng.IntN(8))}
		if rng.IntN(3) == 0 {
			windows = append(windows, 64*(1+rng.IntN(3)))
		}
		if rng.IntN(4) == 0 {
			windows[0] = 32 // no full-attention group
		}
		n := 4 + rng.IntN(24)
		hashes := seq(1000, 1000+uint64(n))
		held := make([]map[uint64]bool, len(windows))
		x := NewIndex()
		if vllm {
			x = NewIndexWithRule(VLLMWindows)
		}
		for g, w := range windows {
			held[g] = map[uint64]bool{}
			x.Apply("e", batch(groupStored(g, w, hashes...)))
			for _, h := range hashes {
				held[g][h] = true
				if rng.IntN(5) == 0 {
					x.Apply("e", batch(groupRemoved(g, h)))
					held[g][h] = false
				}
			}
		}
		want := findLongestCacheHit(vllm, windows, held, 16, hashes)
		if got := hitOf(x.Match(hashes, nil), "e"); got != want {
			t.Fatalf("trial %d (vLLM's rule %v), windows %v, held %v: %d blocks, want %d", trial, vllm, windows, fmt.Sprint(held), got, want)
		}
	}
}
