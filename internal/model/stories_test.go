package model

import (
	"math"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// loadStories loads stories260K on a pool of threads workers; the test owns
// the model (package testutil/loaded, which shares one, imports this
// package).
func loadStories(t *testing.T, threads int) (*Model, testutil.Golden) {
	t.Helper()
	dir := testmodels.Stories260K(t)
	pool := tensor.NewPool(threads)
	t.Cleanup(pool.Close)
	m, err := Load(dir, pool)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	t.Cleanup(func() { m.Close() })
	return m, testutil.StoriesGolden(t)
}

// contiguous returns a pool and a block table 0, 1, 2, ... for n positions.
func contiguous(layout kvlayout.Layout, n int) ([]byte, []int32) {
	blocks := make([]int32, (n+layout.BlockSize-1)/layout.BlockSize)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	// Backed by float32s so that f32 pools are aligned.
	f := make([]float32, (len(blocks)*layout.BlockBytes()+3)/4)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(blocks)*layout.BlockBytes()), blocks
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

func TestStories260KGreedyMatchesGolden(t *testing.T) {
	for _, threads := range []int{1, 2} {
		m, g := loadStories(t, threads)
		layout := m.KVLayout(16)
		kv, blocks := contiguous(layout, len(g.GreedyIDs))
		ids := append([]int32(nil), g.PromptIDs...)
		pos := 0
		next := g.PromptIDs
		for len(ids) < len(g.GreedyIDs) {
			out, err := m.Forward([]Seq{{Tokens: next, Pos: pos, Blocks: blocks, Logits: []int{len(next) - 1}}}, kv, layout)
			if err != nil {
				t.Fatalf("Forward at position %d: %v", pos, err)
			}
			if pos == 0 {
				for i, want := range g.Logits0 {
					if got := float64(out[0][i]); math.Abs(got-want) > 1e-4 {
						t.Errorf("threads=%d: logit %d at position 0 = %.7f, want %.7f", threads, i, got, want)
					}
				}
			}
			pos += len(next)
			tok := argmax(out[0])
			ids = append(ids, tok)
			next = []int32{tok}
		}
		if diff := cmp.Diff(g.GreedyIDs, ids); diff != "" {
			t.Errorf("threads=%d: greedy ids differ from golden (-want +got):\n%s", threads, diff)
		}
	}
}
