package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// attnShape is the attention geometry of a test model.
type attnShape struct {
	heads, kvHeads, headDim int
}

func (a attnShape) String() string {
	return fmt.Sprintf("%dq/%dkv/hd%d", a.heads, a.kvHeads, a.headDim)
}

// newAttnModel returns a Model with only what attention reads: the
// configuration, one layer's q/k/v column offsets and a pool. Its queries
// live in m.s.qkv, its outputs in m.s.attn.
func newAttnModel(t testing.TB, sh attnShape, threads int) *Model {
	t.Helper()
	pool := tensor.NewPool(threads)
	t.Cleanup(pool.Close)
	m := &Model{pool: pool}
	m.cfg.Heads, m.cfg.KVHeads, m.cfg.HeadDim, m.cfg.Layers = sh.heads, sh.kvHeads, sh.headDim, 1
	qd, kvd := m.cfg.QDim(), m.cfg.KVDim()
	m.layers = []layer{{qkv: linearGroup{off: []int{0, qd, qd + kvd}, width: qd + 2*kvd}}}
	return m
}

// attnFixture is a KV pool holding random keys and values for one
// sequence of n positions over shuffled blocks (unwritten slots hold NaN),
// and random queries for every position.
type attnFixture struct {
	layout kvlayout.Layout
	pool   []byte
	blocks []int32
	q      [][]float32 // per position, [QDim]
}

func newAttnFixture(r *rand.Rand, m *Model, blockSize, n int, dt kvlayout.ElemType) *attnFixture {
	c := &m.cfg
	layout := m.KVLayoutOf(blockSize, dt)
	nb := (n+blockSize-1)/blockSize + 2
	pool, _ := contiguous(layout, nb*blockSize)
	kv := viewKV(pool, layout)
	nan := float32(math.NaN())
	for i := range kv.f32 {
		kv.f32[i] = nan
	}
	for i := range kv.u16 {
		kv.u16[i] = tensor.F32ToBF16(nan)
	}
	perm := r.Perm(nb)
	f := &attnFixture{layout: layout, pool: pool}
	for i := range (n + blockSize - 1) / blockSize {
		f.blocks = append(f.blocks, int32(perm[i]))
	}
	row := make([]float32, c.KVDim())
	for p := range n {
		blk, slot := int(f.blocks[p/blockSize]), p%blockSize
		for kvi := range 2 {
			for i := range row {
				row[i] = float32(r.NormFloat64())
			}
			kv.store(layout.Offset(blk, 0, kvi, slot), row)
		}
		q := make([]float32, c.QDim())
		for i := range q {
			// Spread the scores so that the softmax is far from uniform
			// and the running maximum moves between key chunks.
			q[i] = float32(r.NormFloat64() * 1.5)
		}
		f.q = append(f.q, q)
	}
	return f
}

// run computes attention for the seqs' positions [pos, pos+len) (only their
// Pos and token count are used) in one batch and returns the outputs
// per batch token.
func (f *attnFixture) run(m *Model, spans [][2]int) [][]float32 {
	c := &m.cfg
	g := &m.layers[0].qkv
	seqs := make([]Seq, len(spans))
	T := 0
	for i, sp := range spans {
		seqs[i] = Seq{Tokens: make([]int32, sp[1]), Pos: sp[0], Blocks: f.blocks}
		T += sp[1]
	}
	s := &m.s
	s.qkv = grow(s.qkv, T*g.width)
	s.attn = grow(s.attn, T*c.QDim())
	t := 0
	for _, sp := range spans {
		for p := sp[0]; p < sp[0]+sp[1]; p++ {
			copy(s.qkv[t*g.width:], f.q[p])
			t++
		}
	}
	m.planTokens(seqs, T)
	s.slots = kvlayout.LayerSlots(m.KVGroups(false), c.Layers) // what validate sets
	m.attention(0, seqs, viewKV(f.pool, f.layout), f.layout)
	out := make([][]float32, T)
	for t := range out {
		out[t] = append([]float32(nil), s.attn[t*c.QDim():(t+1)*c.QDim()]...)
	}
	return out
}

// reference is attention for the query at position p in float64 over the
// values the kernels see: keys and values as stored in the pool, the query
// scaled by 1/√head_dim in float32 and rounded to bf16 when the kernels
// round activations for a bf16 pool.
//
// With exact false the weights are rounded to bf16 as the bf16 attention
// path rounds them (when it is the path taken); the second result is then
// refSoftmaxValuesBF16's slack (zero elsewhere).
// checkSpans runs spans on m (run) and fails the test where a position's
// output differs in a bit from want's, the one-call prefill's outputs.
func (f *attnFixture) checkSpans(t *testing.T, name string, m *Model, spans [][2]int, want [][]float32) {
	t.Helper()
	got := f.run(m, spans)
	i := 0
	for _, sp := range spans {
		for p := sp[0]; p < sp[0]+sp[1]; p++ {
			if !sameBits(got[i], want[p]) {
				t.Fatalf("%s: position %d differs from the one-call prefill", name, p)
			}
			i++
		}
	}
}

func (f *attnFixture) reference(m *Model, p int, exact bool) (out, slack []float64) {
	c := &m.cfg
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	kv := viewKV(f.pool, f.layout)
	elem := func(off int) float64 {
		if kv.f32 != nil {
			return float64(kv.f32[off])
		}
		return float64(tensor.BF16ToF32(kv.u16[off]))
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	roundP := kv.u16 != nil && tensor.AttnBF16() && !exact
	out = make([]float64, c.QDim())
	slack = make([]float64, c.QDim())
	for h := range c.Heads {
		kvh := h / group
		q := make([]float64, hd)
		for i := range q {
			v := f.q[p][h*hd+i] * scale
			if kv.u16 != nil && tensor.BF16Activations() {
				v = tensor.BF16ToF32(tensor.F32ToBF16(v))
			}
			q[i] = float64(v)
		}
		sc := make([]float64, p+1)
		vs := make([][]float64, p+1)
		for j := range sc {
			base := f.layout.Offset(int(f.blocks[j/f.layout.BlockSize]), 0, 0, j%f.layout.BlockSize) + kvh*hd
			for i := range hd {
				sc[j] += q[i] * elem(base+i)
			}
			base = f.layout.Offset(int(f.blocks[j/f.layout.BlockSize]), 0, 1, j%f.layout.BlockSize) + kvh*hd
			vs[j] = make([]float64, hd)
			for i := range hd {
				vs[j][i] = elem(base + i)
			}
		}
		if roundP {
			o, sl := refSoftmaxValuesBF16(sc, vs)
			copy(out[h*hd:], o)
			copy(slack[h*hd:], sl)
			continue
		}
		copy(out[h*hd:], refSoftmaxValues(sc, vs, false))
	}
	return out, slack
}

// refSoftmaxValues returns Σ_j softmax(sc)_j·vs[j] in float64. With roundP
// it rounds the weights to bf16 as the bf16 attention path does
// (attention.go): over chunks of attnKeyChunk keys with the running maximum
// m, each weight is bf16(e^(s_j−m)), the sums and the accumulators are
// rescaled by e^(m_old−m) when m grows, and the normaliser sums the rounded
// weights. Without it the softmax is exact.
func refSoftmaxValues(sc []float64, vs [][]float64, roundP bool) []float64 {
	hd := len(vs[0])
	out := make([]float64, hd)
	if !roundP {
		mx := math.Inf(-1)
		for _, s := range sc {
			mx = max(mx, s)
		}
		var sum float64
		w := make([]float64, len(sc))
		for j, s := range sc {
			w[j] = math.Exp(s - mx)
			sum += w[j]
		}
		for j := range sc {
			for i := range hd {
				out[i] += w[j] / sum * vs[j][i]
			}
		}
		return out
	}
	out, _ = refSoftmaxValuesBF16(sc, vs)
	return out
}

// refSoftmaxValuesBF16 is refSoftmaxValues with roundP. Its second result
// is, per output element, the most the kernels can differ from it by
// rounding a weight to the other bf16 neighbour: a weight whose float64
// value lies within 2⁻¹⁶ (relative) of the midpoint between two bf16 values
// may round either way from the kernels' f32 score and exponential, and
// moves the output by up to one bf16 ulp of it times |v_j| + |out|, over l.
func refSoftmaxValuesBF16(sc []float64, vs [][]float64) (out, slack []float64) {
	hd := len(vs[0])
	out = make([]float64, hd)
	type flip struct {
		j      int
		ulp, m float64 // the weight's bf16 ulp and the maximum it was taken against
	}
	var flips []flip
	m, l := math.Inf(-1), 0.0
	for c0 := 0; c0 < len(sc); c0 += attnKeyChunk {
		c1 := min(c0+attnKeyChunk, len(sc))
		mc := math.Inf(-1)
		for _, s := range sc[c0:c1] {
			mc = max(mc, s)
		}
		if mc > m {
			f := math.Exp(m - mc)
			l *= f
			for i := range out {
				out[i] *= f
			}
			m = mc
		}
		for j := c0; j < c1; j++ {
			e := math.Exp(sc[j] - m)
			b := tensor.F32ToBF16(float32(e))
			w := float64(tensor.BF16ToF32(b))
			up := float64(tensor.BF16ToF32(b+1)) - w
			lo := w - float64(tensor.BF16ToF32(b-1))
			if d := e - w; math.Abs(d-up/2) < e/65536 || math.Abs(d+lo/2) < e/65536 {
				flips = append(flips, flip{j, max(up, lo), m})
			}
			l += w
			for i := range hd {
				out[i] += w * vs[j][i]
			}
		}
	}
	for i := range out {
		out[i] /= l
	}
	slack = make([]float64, hd)
	for _, f := range flips {
		for i := range hd {
			slack[i] += f.ulp * math.Exp(f.m-m) * (math.Abs(vs[f.j][i]) + math.Abs(out[i])) / l
		}
	}
	return out, slack
}

// TestAttentionMatchesFloat64 checks prefill and decode attention against a
// float64 reference on odd shapes: GQA groups of 1 to 5 heads, head
// dimensions 64, 128 and ones that are not a multiple of the vector width,
// block sizes that divide the key chunk, do not, and exceed it, lengths
// that are not a multiple of the block, under every ISA and KV dtype.
func TestAttentionMatchesFloat64(t *testing.T) {
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	cases := []struct {
		sh        attnShape
		blockSize int
		n         int
	}{
		{attnShape{4, 2, 64}, 16, 301},
		{attnShape{6, 2, 128}, 7, 130},
		{attnShape{5, 1, 64}, 16, 97},
		{attnShape{4, 4, 128}, 128, 200},
		{attnShape{9, 3, 64}, 5, 67},
		{attnShape{8, 2, 40}, 16, 150},
		{attnShape{2, 1, 8}, 3, 45},
	}
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		for _, dt := range []kvlayout.ElemType{kvlayout.BF16, kvlayout.F32} {
			for _, tc := range cases {
				t.Run(fmt.Sprintf("%s/%s KV/%v/block %d/n %d", isa, dt, tc.sh, tc.blockSize, tc.n), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.blockSize)))
					m := newAttnModel(t, tc.sh, 2)
					f := newAttnFixture(r, m, tc.blockSize, tc.n, dt)
					prefill := f.run(m, [][2]int{{0, tc.n}})
					var worstExact, worstRounded float64
					for p := range tc.n {
						want, slack := f.reference(m, p, false)
						exact, _ := f.reference(m, p, true)
						for i, w := range want {
							// Values are N(0,1): an absolute bound is a
							// relative one. f32 accumulation over a few
							// hundred keys stays far below it; the slack
							// covers the weights whose bf16 rounding is
							// too close to call from float64.
							d := math.Abs(float64(prefill[p][i]) - w)
							worstRounded = max(worstRounded, d)
							if d > 2e-5+slack[i] {
								t.Fatalf("position %d: |attention − float64 reference| = %g > 2e-5 + %g (slack) at %d", p, d, slack[i], i)
							}
							worstExact = max(worstExact, math.Abs(float64(prefill[p][i])-exact[i]))
						}
					}
					// Against the exact softmax the bf16 weights of the
					// bf16 path cost up to ~2⁻⁹ of a weight each, mostly
					// averaging out (measured on these cases: below 4e-3
					// for values of unit scale); elsewhere the reference is
					// exact.
					bound := 2e-5
					if dt == kvlayout.BF16 && tensor.AttnBF16() {
						bound = 5e-3
					}
					t.Logf("max |attention − float64 reference| = %.3g; − exact float64 softmax: %.3g", worstRounded, worstExact)
					if worstExact > bound {
						t.Fatalf("max |attention − exact float64 softmax| = %g > %g", worstExact, bound)
					}
					// A decode step for the last positions computes exactly
					// what the prefill did.
					for _, p := range []int{tc.n - 1, tc.n / 2, 0} {
						dec := f.run(m, [][2]int{{p, 1}})
						if !sameBits(dec[0], prefill[p]) {
							t.Fatalf("position %d: decode attention differs from prefill", p)
						}
					}
				})
			}
		}
	}
}

// TestAttentionTilingIsInvariant checks that a query's attention output is
// bit-identical whatever tile, chunk of the prompt and batch it is computed
// in: one call for the whole prompt, chunks of 16, 17 and 64 positions,
// each position alone (decode, split across the two threads by KV head),
// two decode tokens in one batch (an item each) and mixed batches of
// several chunks.
func TestAttentionTilingIsInvariant(t *testing.T) {
	for _, dt := range []kvlayout.ElemType{kvlayout.BF16, kvlayout.F32} {
		for _, sh := range []attnShape{{9, 3, 64}, {4, 1, 128}, {4, 4, 64}} {
			t.Run(fmt.Sprintf("%s KV/%v", dt, sh), func(t *testing.T) {
				const n = 333
				r := rand.New(rand.NewPCG(5, 6))
				m := newAttnModel(t, sh, 2)
				f := newAttnFixture(r, m, 16, n, dt)
				want := f.run(m, [][2]int{{0, n}})
				check := func(name string, spans [][2]int) {
					t.Helper()
					f.checkSpans(t, name, m, spans, want)
				}
				for _, chunk := range []int{1, 16, 17, 64} {
					for p := 0; p < n; p += chunk {
						check(fmt.Sprintf("chunks of %d", chunk), [][2]int{{p, min(chunk, n-p)}})
					}
				}
				// Several pieces of the prompt in one batch, as if they
				// were different sequences sharing the KV.
				check("mixed batch", [][2]int{{300, 33}, {5, 1}, {64, 70}, {332, 1}, {0, 3}, {200, 17}})
				// Two decode tokens: one item each for all KV heads, where
				// one token alone is split into an item per KV head.
				check("two decode tokens", [][2]int{{100, 1}, {332, 1}})
			})
		}
	}
}

// TestLongPromptChunkingIsBitIdentical runs a 333-token prompt through
// whole models (GQA with head_dim 64; bf16 weights with a bf16 KV pool and
// f32 weights with an f32 one) in one Forward call, in chunks of 16, 17 and
// 64 tokens and token by token (decode steps), and requires bit-identical
// logits at every position.
func TestLongPromptChunkingIsBitIdentical(t *testing.T) {
	specs := []struct {
		name string
		spec modelinit.Spec
		kv   kvlayout.ElemType
	}{
		{"bf16 weights, bf16 KV", testSpec(func(s *modelinit.Spec) {
			s.DType, s.Heads, s.KVHeads, s.HeadDim, s.MaxPositions = "bf16", 6, 2, 64, 512
		}), kvlayout.BF16},
		{"f32 weights, f32 KV", testSpec(func(s *modelinit.Spec) {
			s.Heads, s.KVHeads, s.HeadDim, s.MaxPositions = 4, 1, 64, 512
		}), kvlayout.F32},
	}
	const n = 333
	for _, sp := range specs {
		t.Run(sp.name, func(t *testing.T) {
			dir := writeTestModel(t, sp.spec)
			m := loadTestModel(t, dir, 2)
			r := rand.New(rand.NewPCG(7, 8))
			tokens := randomTokens(r, n, sp.spec.Vocab)
			for _, bs := range []int{16, 5} {
				layout := m.KVLayoutOf(bs, sp.kv)
				want := runAlone(t, m, layout, tokens)
				for _, chunk := range []int{16, 17, 64, 1} {
					kv, blocks := contiguous(layout, n)
					V := m.VocabSize()
					for p := 0; p < n; p += chunk {
						k := min(chunk, n-p)
						out, err := m.Forward([]Seq{{Tokens: tokens[p : p+k], Pos: p, Blocks: blocks, Logits: allIndexes(k)}}, kv, layout)
						if err != nil {
							t.Fatal(err)
						}
						for j := range k {
							if !sameBits(out[0][j*V:(j+1)*V], want[p+j]) {
								t.Fatalf("block size %d, chunks of %d: position %d differs from the one-call prefill", bs, chunk, p+j)
							}
						}
					}
				}
			}
		})
	}
}

// BenchmarkAttention is one layer's attention on the smollm2-135m shape (9
// query heads, 3 KV heads, head_dim 64, bf16 KV, blocks of 16): a whole
// prompt of n tokens in one call (prefill) and one token at position n-1
// (decode). GFLOP/s counts 4·head_dim flops per (query head, key) pair
// under the causal mask.
func BenchmarkAttention(b *testing.B) {
	sh := attnShape{9, 3, 64}
	for _, n := range []int{512, 2048, 8192} {
		for _, threads := range []int{1, 2} {
			r := rand.New(rand.NewPCG(1, 2))
			m := newAttnModel(b, sh, threads)
			f := newAttnFixture(r, m, 16, n, kvlayout.BF16)
			for _, mode := range []string{"prefill", "decode"} {
				span := [2]int{0, n}
				pairs := float64(n) * float64(n+1) / 2
				if mode == "decode" {
					span, pairs = [2]int{n - 1, 1}, float64(n)
				}
				b.Run(fmt.Sprintf("%s/n=%d/threads=%d", mode, n, threads), func(b *testing.B) {
					for b.Loop() {
						f.run(m, [][2]int{span})
					}
					flops := pairs * float64(sh.heads) * 4 * float64(sh.headDim)
					b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// TestPlanAttentionSplitsALoneDecodeToken checks the decode work items: a
// single sequence's decode token is one item per KV head when the pool has
// more threads than the batch has items, one item per key segment for all
// KV heads when its keys span several segments, and one item for all KV
// heads otherwise (one thread, several decode tokens, or prefill tiles
// beside it).
func TestPlanAttentionSplitsALoneDecodeToken(t *testing.T) {
	sh := attnShape{9, 3, 64}
	cases := []struct {
		name    string
		threads int
		spans   [][2]int // (position, tokens) per sequence
		want    []int32  // the items' KV heads, in order
		parts   int32    // the items' parts of their token's key segments
	}{
		{"one token, 2 threads", 2, [][2]int{{100, 1}}, []int32{0, 1, 2}, 0},
		{"one token past two segments, 2 threads", 2, [][2]int{{2*attnSegKeys + 5, 1}}, []int32{-1, -1, -1}, 3},
		{"one token past two segments, 1 thread", 1, [][2]int{{2*attnSegKeys + 5, 1}}, []int32{-1}, 0},
		{"one token, 1 thread", 1, [][2]int{{100, 1}}, []int32{-1}, 0},
		{"two tokens, 2 threads", 2, [][2]int{{100, 1}, {40, 1}}, []int32{-1, -1}, 0},
		{"a prefill tile beside", 2, [][2]int{{0, 16}, {100, 1}}, []int32{0, 1, 2, -1}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newAttnModel(t, sh, c.threads)
			seqs := make([]Seq, len(c.spans))
			T := 0
			for i, sp := range c.spans {
				seqs[i] = Seq{Tokens: make([]int32, sp[1]), Pos: sp[0]}
				T += sp[1]
			}
			m.planTokens(seqs, T)
			var got []int32
			for _, it := range m.s.items {
				got = append(got, it.kvh)
				if it.tile == int32(len(m.s.tiles)-1) && it.parts != c.parts {
					t.Fatalf("item %+v: %d parts, want %d", it, it.parts, c.parts)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("items' KV heads %v, want %v", got, c.want)
			}
		})
	}
}
