package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestAttentionSegmentsAreInvariant checks that a query whose keys span
// several key segments gets bit-identical outputs whatever tile, chunk of
// the prompt, batch and thread count it is computed in — one call for the
// whole prompt, chunks of 17, each position alone on one thread (segments
// folded as they end) and on two (a token past the first segment split
// into one item per segment, their states folded afterwards), two decode
// tokens in one batch, a mixed batch — and stays within the float64
// reference's bound. Segments of attnSegKeys and of 128 keys (so that
// windows and block sizes cut them in more places), full attention and
// windows that start inside a segment, under every ISA and KV dtype.
func TestAttentionSegmentsAreInvariant(t *testing.T) {
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		for _, dt := range []kvlayout.ElemType{kvlayout.BF16, kvlayout.F32} {
			for _, tc := range []struct {
				sh       attnShape
				seg, bs  int
				win      int
				segments int // the prompt's length in segments, plus 77 keys
			}{
				{attnShape{9, 3, 64}, attnSegKeys, 16, 0, 2},
				{attnShape{9, 3, 64}, 128, 16, 0, 3},
				{attnShape{4, 1, 128}, 128, 5, 0, 3},
				{attnShape{6, 2, 40}, 128, 16, 300, 4},
				{attnShape{9, 3, 64}, 128, 5, 100, 3},
			} {
				n := tc.segments*tc.seg + 77
				name := fmt.Sprintf("%s/%s KV/%v/segments of %d/block %d/window %d/n %d", isa, dt, tc.sh, tc.seg, tc.bs, tc.win, n)
				t.Run(name, func(t *testing.T) {
					testAttentionSegments(t, dt, tc.sh, tc.seg, tc.bs, tc.win, n)
				})
			}
		}
	}
}

func testAttentionSegments(t *testing.T, dt kvlayout.ElemType, sh attnShape, seg, bs, win, n int) {
	r := rand.New(rand.NewPCG(uint64(n), uint64(seg)))
	models := map[int]*Model{}
	for _, threads := range []int{1, 2} {
		m := newAttnModel(t, sh, threads)
		if seg != attnSegKeys {
			m.attnSeg = seg
		}
		m.layers[0].window = win
		models[threads] = m
	}
	f := newAttnFixture(r, models[2], bs, n, dt)
	want := f.run(models[2], [][2]int{{0, n}})
	check := func(name string, m *Model, spans [][2]int) {
		t.Helper()
		f.checkSpans(t, name, m, spans, want)
	}
	for p := 0; p < n; p += 17 {
		check("chunks of 17", models[2], [][2]int{{p, min(17, n-p)}})
	}
	for p := range n {
		check("decode, 1 thread", models[1], [][2]int{{p, 1}})
		check("decode, 2 threads", models[2], [][2]int{{p, 1}})
	}
	check("two decode tokens", models[2], [][2]int{{n - 1, 1}, {seg + 3, 1}})
	check("mixed batch", models[2], [][2]int{{n - 40, 40}, {2*seg - 1, 1}, {seg - 20, 45}, {0, 3}})

	// A lone token past the first segment is split by segments on two
	// threads: one item per segment of full attention.
	m := models[2]
	p := n - 1
	m.planTokens([]Seq{{Tokens: make([]int32, 1), Pos: p}}, 1)
	if len(m.s.items) != p/seg+1 || len(m.s.segToks) != 1 {
		t.Fatalf("a token at %d: %d items, %d split tokens; want %d, 1", p, len(m.s.items), len(m.s.segToks), p/seg+1)
	}
	for _, it := range m.s.items {
		if it.kvh != -1 || it.parts != int32(p/seg+1) {
			t.Fatalf("item %+v is not a part of the token's segments for every KV head", it)
		}
	}

	// The segments' merge computes attention: the float64 reference's
	// bound (full attention: the reference has no window), at positions
	// past one, two and three segment boundaries. The bf16 path's weights
	// are rounded relative to their segment's maximum, which the rounded
	// reference does not model: its bound is the exact softmax's of
	// TestAttentionMatchesFloat64.
	if win > 0 {
		return
	}
	bf16 := dt == kvlayout.BF16 && tensor.AttnBF16()
	for _, p := range []int{seg, seg + 1, 2*seg + 5, n - 1} {
		ref, slack := f.reference(m, p, bf16)
		for i, w := range ref {
			bound := 2e-5 + slack[i]
			if bf16 {
				bound = 5e-3
			}
			if d := math.Abs(float64(want[p][i]) - w); d > bound {
				t.Fatalf("position %d: |attention − float64 reference| = %g > %g at %d", p, d, bound, i)
			}
		}
	}
}

// TestAttentionSegmentsKeepShortContexts checks that a query whose keys lie
// in one segment gets the bits of the segment's plain online softmax: its
// outputs with segments of attnSegKeys equal those with one segment longer
// than the sequence.
func TestAttentionSegmentsKeepShortContexts(t *testing.T) {
	for _, dt := range []kvlayout.ElemType{kvlayout.BF16, kvlayout.F32} {
		sh := attnShape{9, 3, 64}
		r := rand.New(rand.NewPCG(9, 10))
		m := newAttnModel(t, sh, 2)
		n := attnSegKeys
		f := newAttnFixture(r, m, 16, n, dt)
		got := f.run(m, [][2]int{{0, n}})
		m.attnSeg = 64 * attnSegKeys
		want := f.run(m, [][2]int{{0, n}})
		for p := range n {
			if !sameBits(got[p], want[p]) {
				t.Fatalf("%s KV: position %d changed with segments of %d keys", dt, p, attnSegKeys)
			}
		}
	}
}
