package kvevents

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

func stored(hs ...uint64) Event  { return Event{Kind: BlockStored, Hashes: hs} }
func removed(hs ...uint64) Event { return Event{Kind: BlockRemoved, Hashes: hs} }

func batch(evs ...Event) *Batch { return &Batch{Events: evs} }

func sortedHits(h []Hit) []Hit {
	slices.SortFunc(h, func(a, b Hit) int { return strings.Compare(a.Engine, b.Engine) })
	return h
}

func TestIndexMatchesLongestPrefixPerEngine(t *testing.T) {
	x := NewIndex()
	x.Apply("a", batch(stored(1, 2, 3)))
	x.Apply("b", batch(stored(1, 2), stored(9)))
	x.Apply("c", batch(stored(2, 3))) // holds later blocks but not the first
	x.AddEngine("d")

	tests := []struct {
		name   string
		hashes []uint64
		want   []Hit
	}{
		{"a full match and a shorter one", []uint64{1, 2, 3, 4}, []Hit{{"a", 3}, {"b", 2}}},
		{"a miss on the first block matches nothing", []uint64{7, 2, 3}, nil},
		{"every block held", []uint64{1, 2}, []Hit{{"a", 2}, {"b", 2}}},
		{"no hashes", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, sortedHits(x.Match(tc.hashes, nil))); diff != "" {
				t.Errorf("Match (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIndexRemovalsAndClears(t *testing.T) {
	x := NewIndex()
	x.Apply("a", batch(stored(1, 2, 3)))
	x.Apply("b", batch(stored(1, 2, 3)))

	x.Apply("a", batch(removed(2), removed(42))) // 42 was never stored: ignored
	if diff := cmp.Diff([]Hit{{"a", 1}, {"b", 3}}, sortedHits(x.Match([]uint64{1, 2, 3}, nil))); diff != "" {
		t.Errorf("after a removal (-want +got):\n%s", diff)
	}
	if got := x.Blocks("a"); got != 2 {
		t.Errorf("engine a holds %d blocks, want 2", got)
	}

	x.Apply("b", batch(Event{Kind: AllBlocksCleared}))
	if diff := cmp.Diff([]Hit{{"a", 1}}, x.Match([]uint64{1, 2, 3}, nil)); diff != "" {
		t.Errorf("after AllBlocksCleared (-want +got):\n%s", diff)
	}

	x.RemoveEngine("a")
	if got := x.Match([]uint64{1}, nil); len(got) != 0 || len(x.blocks) != 0 || x.Engines() != 1 {
		t.Errorf("after removing a: Match = %v, %d hashes left, %d engines", got, len(x.blocks), x.Engines())
	}
	x.Apply("c", batch(stored(1))) // reuses a's slot
	if diff := cmp.Diff([]Hit{{"c", 1}}, x.Match([]uint64{1}, nil)); diff != "" {
		t.Errorf("a new engine in a freed slot (-want +got):\n%s", diff)
	}
}

func TestIndexBeyondSixtyFourEngines(t *testing.T) {
	x := NewIndex()
	for e := range 200 {
		// Engine e holds the first e%7+1 blocks of the chain 100, 101, ...
		var hs []uint64
		for i := range e%7 + 1 {
			hs = append(hs, uint64(100+i))
		}
		x.Apply(fmt.Sprint("e", e), batch(stored(hs...)))
	}
	hits := x.Match([]uint64{100, 101, 102, 103, 104, 105, 106, 107}, nil)
	if len(hits) != 200 {
		t.Fatalf("%d hits, want 200", len(hits))
	}
	for _, h := range hits {
		var e int
		fmt.Sscanf(h.Engine, "e%d", &e)
		if h.Blocks != e%7+1 {
			t.Errorf("engine %s matched %d blocks, want %d", h.Engine, h.Blocks, e%7+1)
		}
	}
	x.ClearEngine("e130")
	if got := x.Blocks("e130"); got != 0 {
		t.Errorf("a cleared engine holds %d blocks", got)
	}
}

func TestIndexIsSafeForConcurrentUse(t *testing.T) {
	x := NewIndex()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			name := fmt.Sprint("e", w)
			for i := range 500 {
				x.Apply(name, batch(stored(uint64(i), uint64(i+1))))
				x.Match([]uint64{uint64(i), uint64(i + 1)}, nil)
				if i%50 == 0 {
					x.ClearEngine(name)
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkMatch measures one routing lookup: a 128-block (2048-token)
// prompt against engines that all hold a 32-block shared system prompt,
// one of which also holds the rest of this prompt, each also holding 2000
// blocks of its own.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			x := NewIndex()
			prompt := make([]uint64, 128)
			for i := range prompt {
				prompt[i] = uint64(1<<40 + i)
			}
			for e := range n {
				own := make([]uint64, 2000)
				for i := range own {
					own[i] = uint64(e)<<20 | uint64(i)
				}
				x.Apply(fmt.Sprint("engine-", e), batch(stored(prompt[:32]...), stored(own...)))
			}
			x.Apply("engine-0", batch(stored(prompt...)))
			var hits []Hit
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				hits = x.Match(prompt, hits[:0])
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/lookup")
			if len(hits) != n {
				b.Fatalf("%d hits, want %d", len(hits), n)
			}
		})
	}
}

// BenchmarkPublisherHook measures what publishing costs the engine's step
// loop per block: the cache's BlockStored and BlockRemoved calls, and a
// Flush per 16 blocks (the encoding and sending happen on the publisher's
// goroutine).
func BenchmarkPublisherHook(b *testing.B) {
	p, err := NewPublisher(Config{Endpoint: "tcp://127.0.0.1:0", MaxQueueSize: 1 << 16}, PublisherOptions{BlockSize: 16, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer p.shutdown(false, 0)
	tokens := make([]int32, 16)
	var h, parent kvcache.BlockHash
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h[0], h[1] = byte(i), byte(i>>8)
		p.BlockStored(h, parent, tokens)
		p.BlockRemoved(parent)
		parent = h
		if i++; i%16 == 0 {
			p.Flush()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/block")
}
