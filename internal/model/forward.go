package model

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Seq is one sequence's share of a Forward batch.
type Seq struct {
	// Tokens are the new tokens to run.
	Tokens []int32
	// Pos is the position of Tokens[0]; the KV of positions [0, Pos) is
	// already in the pool.
	Pos int
	// Blocks are the physical block ids covering positions
	// [0, Pos+len(Tokens)): block i holds positions [i*BlockSize,
	// (i+1)*BlockSize). It is the block table of a pool with one KV-cache
	// group (every layer in every block); with several, Tables replaces it.
	Blocks []int32
	// Tables, when set, are the block tables of the pool's KV-cache groups
	// (Model.KVGroups), one per group, each laid out as Blocks. A table
	// of a sliding-window group may hold kvlayout.NullBlock for blocks
	// wholly before kvlayout.FirstNeeded(window, Pos): their KV is never
	// read.
	Tables [][]int32
	// Logits are indexes into Tokens whose next-token logits are wanted.
	Logits []int
	// Prompt and Output, when set, are all of the sequence's known tokens:
	// the prompt, then the tokens sampled so far, covering at least
	// positions [0, Pos+len(Tokens)) (two slices so the engine need not
	// join them every step). Forward does not read them; a forward pass that
	// derives its output from the whole history (internal/sim's simulated
	// model) does, through TokenAt.
	Prompt, Output []int32
}

// Table returns the block table of KV-cache group g: Tables[g], or Blocks
// when Tables is not set.
func (s *Seq) Table(g int) []int32 {
	if s.Tables != nil {
		return s.Tables[g]
	}
	return s.Blocks
}

// TokenAt returns the token at position p of the sequence, from Prompt and
// Output.
func (s *Seq) TokenAt(p int) int32 {
	if p < len(s.Prompt) {
		return s.Prompt[p]
	}
	return s.Output[p-len(s.Prompt)]
}

// SeqErrors is the error of a forward pass that failed for some sequences
// of a batch only, by index into the batch; the logits of the others are
// valid. The engine fails the requests of those sequences and samples the
// rest.
type SeqErrors map[int]error

// Error names how many sequences failed and the error of the lowest index.
func (e SeqErrors) Error() string {
	first := -1
	for i := range e {
		if first < 0 || i < first {
			first = i
		}
	}
	switch len(e) {
	case 0:
		return "no sequence failed"
	case 1:
		return fmt.Sprintf("sequence %d of the batch: %v", first, e[first])
	}
	return fmt.Sprintf("%d sequences of the batch failed, the first (%d): %v", len(e), first, e[first])
}

// scratch holds the activations of one Forward call, grown on demand and
// reused across calls (only small per-call closures are allocated).
type scratch struct {
	x, xn, attn, tmp []float32 // [T, Hidden], [T, Hidden], [T, QDim], [T, Hidden]
	qkv, gu, h       []float32 // [T, qkv width], [T, 2·FFN], [T, FFN]
	part             []float32 // un-fused matmul output before scattering
	cos, sin         []float32 // [T, HeadDim/2]
	cosL, sinL       []float32 // [T, HeadDim/2], Gemma 3's local RoPE
	tokSeq, tokPos   []int32   // per token: its sequence and position
	rows             []float32 // [R, Hidden] normed rows for the LM head
	logits           []float32 // [R, Vocab]
	out              [][]float32
	tiles            []attnTile
	items            []attnItem
	packed           [][]uint32  // bf16 attention: packed keys per (sequence, KV head)
	packedF32        [][]float32 // f32-activation attention: packed keys per (sequence, KV head)
	packItems        []packItem
	segToks          []segToken           // decode tokens split by key segments
	segBuf, segRun   []float32            // their segments' partial states; a merge's running outputs
	slots            []kvlayout.LayerSlot // per layer: its KV-cache group and slot
	attnScratch      sync.Pool            // *attnScratch, one per busy worker
	moe              moeScratch
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Forward runs the new tokens of seqs through the model, writing their K
// and V into the paged pool (laid out as layout; F32 pools must be 4-byte
// aligned) and returning, for each sequence, len(Logits)·VocabSize logits
// (row-major, in the order of Seq.Logits). The returned slices are valid
// until the next call.
//
// All new tokens of all sequences form one [T, hidden] activation, so every
// weight matmul is a single kernel call over T rows; attention runs per
// (KV head, tile of a sequence's tokens) over the sequence's paged KV. A
// sequence's logits are bit-identical whatever else is in the batch and
// however its prompt is split into calls: each matmul output element
// depends only on its input row and weight row, and attention for a query
// reduces over keys 0..pos in one fixed order.
//
// Forward is not safe for concurrent use. Sequences in one call must not
// write the same KV slot (shared prefix blocks are only read).
func (m *Model) Forward(seqs []Seq, pool []byte, layout kvlayout.Layout) ([][]float32, error) {
	if m.closed {
		return nil, errors.New("model: Forward called after Close")
	}
	T, R, err := m.validate(seqs, pool, layout)
	if err != nil {
		return nil, err
	}
	kv := viewKV(pool, layout)
	c := &m.cfg
	s := &m.s
	H, half := c.Hidden, len(m.invFreq)
	s.x = grow(s.x, T*H)
	s.xn = grow(s.xn, T*H)
	s.tmp = grow(s.tmp, T*H)
	s.attn = grow(s.attn, T*c.QDim())
	s.cos = grow(s.cos, T*half)
	s.sin = grow(s.sin, T*half)
	if m.invFreqLocal != nil {
		s.cosL = grow(s.cosL, T*half)
		s.sinL = grow(s.sinL, T*half)
	}
	m.planTokens(seqs, T)
	eps := float32(c.RMSNormEps)
	m.rows(T, parallelRows, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			sq := &seqs[s.tokSeq[t]]
			id := sq.Tokens[int(s.tokPos[t])-sq.Pos]
			x := s.x[t*H : (t+1)*H]
			m.embed.Row(int(id), x)
			if c.ModelType == "gemma3_text" {
				scaleEmbedding(x, c.Hidden, m.embed.DType)
			}
			tensor.RMSNorm(s.xn[t*H:(t+1)*H], x, m.layers[0].attnNorm, eps)
			ropeRow(m.invFreq, m.ropeScale, int(s.tokPos[t]), s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half])
			if m.invFreqLocal != nil {
				ropeRow(m.invFreqLocal, 1, int(s.tokPos[t]), s.cosL[t*half:(t+1)*half], s.sinL[t*half:(t+1)*half])
			}
		}
	})

	F := c.Intermediate
	s.h = grow(s.h, T*F)
	for li := range m.layers {
		l := &m.layers[li]
		// s.xn holds attnNorm(x) here.
		s.qkv = m.runGroup(&l.qkv, s.qkv, s.xn, T)
		m.prepareAttention(l, li, seqs, kv, layout, T)
		m.attention(li, seqs, kv, layout)
		m.matmul(s.tmp, s.attn, T, &l.o)
		m.rows(T, parallelHotRows, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				x, o := s.x[t*H:(t+1)*H], s.tmp[t*H:(t+1)*H]
				if l.oBias != nil {
					addTo(o, l.oBias)
				}
				if l.postAttnNorm != nil {
					tensor.RMSNorm(o, o, l.postAttnNorm, eps)
				}
				addTo(x, o)
				tensor.RMSNorm(s.xn[t*H:(t+1)*H], x, l.ffnNorm, eps)
			}
		})
		if l.moe != nil {
			m.moeFFN(l, T)
		} else {
			s.gu = m.runGroup(&l.gateUp, s.gu, s.xn, T)
			gu := &l.gateUp
			m.rows(T, parallelHotRows, func(lo, hi int) {
				for t := lo; t < hi; t++ {
					row := s.gu[t*gu.width : (t+1)*gu.width]
					h := s.h[t*F : (t+1)*F]
					copy(h, row[gu.off[0]:gu.off[0]+F])
					if c.ModelType == "gemma3_text" {
						geluTanhMul(h, row[gu.off[1]:gu.off[1]+F])
					} else {
						tensor.SiLUMul(h, row[gu.off[1]:gu.off[1]+F])
					}
				}
			})
			m.matmul(s.tmp, s.h, T, &l.down)
		}
		if l.postFFNorm != nil {
			m.rows(T, parallelHotRows, func(lo, hi int) {
				for t := lo; t < hi; t++ {
					o := s.tmp[t*H : (t+1)*H]
					tensor.RMSNorm(o, o, l.postFFNorm, eps)
				}
			})
		}
		// The residual add and the next layer's input norm share a pass.
		var next []float32
		if li+1 < len(m.layers) {
			next = m.layers[li+1].attnNorm
		}
		m.rows(T, parallelHotRows, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				x := s.x[t*H : (t+1)*H]
				addTo(x, s.tmp[t*H:(t+1)*H])
				if next != nil {
					tensor.RMSNorm(s.xn[t*H:(t+1)*H], x, next, eps)
				}
			}
		})
	}
	return m.logits(seqs, T, R), nil
}

// Batch sizes from which per-token passes are split across the pool; below
// them waking a worker costs more than the work. Passes that touch cold
// memory (the embedding rows, the KV slots written) gain from a second
// thread early; the residual, norm and SiLU passes over a few hot rows did
// not (1 thread 0.8 ms, 2 threads 1.4 ms per 16-token step, measured).
const (
	parallelRows    = 8
	parallelHotRows = 64
)

// rows runs fn over token rows [0, T), in parallel from `from` rows on. Each
// row is processed identically either way.
func (m *Model) rows(T, from int, fn func(lo, hi int)) {
	if T < from {
		fn(0, T)
		return
	}
	m.pool.Parallel(T, fn)
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// matmulSlab is the number of activation rows per MatMul call in a long
// prefill: the kernels walk the weights in small panels and stream every
// activation row past each panel, so the rows of one call should stay in
// the L2 cache (128 rows of 576 bf16 activations are 144 KiB). At 2048
// rows in one call the weight matmuls ran 1.5× slower than in slabs of
// 128 (docs/performance.md, "Long-context prefill").
const matmulSlab = 128

// matmul is m.pool.MatMul over T rows, in slabs of matmulSlab rows. Each
// output element is computed the same way whatever the slab (MatMul is
// batch invariant), so slabbing changes no result.
func (m *Model) matmul(out, x []float32, T int, w *tensor.Mat) {
	n, k := w.Rows, w.Cols
	for t0 := 0; t0 < T; t0 += matmulSlab {
		rows := min(matmulSlab, T-t0)
		m.pool.MatMul(out[t0*n:(t0+rows)*n], x[t0*k:(t0+rows)*k], rows, w)
	}
}

// runGroup computes the [T, g.width] output of a linear group into buf.
func (m *Model) runGroup(g *linearGroup, buf, x []float32, T int) []float32 {
	buf = grow(buf, T*g.width)
	if g.fused {
		m.matmul(buf, x, T, &g.mats[0])
		return buf
	}
	for k := range g.mats {
		w := &g.mats[k]
		m.s.part = grow(m.s.part, T*w.Rows)
		m.matmul(m.s.part, x, T, w)
		for t := range T {
			copy(buf[t*g.width+g.off[k]:], m.s.part[t*w.Rows:(t+1)*w.Rows])
		}
	}
	return buf
}

// prepareAttention adds the q/k/v biases, normalises each query and key
// head (qwen3's q_norm and k_norm), applies RoPE to the queries and keys and
// stores every new token's K and V row in its pool slot.
func (m *Model) prepareAttention(l *layer, li int, seqs []Seq, kv kvView, layout kvlayout.Layout, T int) {
	c := &m.cfg
	s := &m.s
	g := &l.qkv
	hd, half, kvd := c.HeadDim, len(m.invFreq), c.KVDim()
	eps := float32(c.RMSNormEps)
	m.rows(T, parallelRows, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			row := s.qkv[t*g.width : (t+1)*g.width]
			q := row[g.off[0] : g.off[0]+c.QDim()]
			k := row[g.off[1] : g.off[1]+kvd]
			v := row[g.off[2] : g.off[2]+kvd]
			if l.qBias != nil {
				addTo(q, l.qBias)
				addTo(k, l.kBias)
				addTo(v, l.vBias)
			}
			if l.qNorm != nil {
				for h := 0; h < c.Heads; h++ {
					tensor.RMSNorm(q[h*hd:(h+1)*hd], q[h*hd:(h+1)*hd], l.qNorm, eps)
				}
				for h := 0; h < c.KVHeads; h++ {
					tensor.RMSNorm(k[h*hd:(h+1)*hd], k[h*hd:(h+1)*hd], l.kNorm, eps)
				}
			}
			cos, sin := s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half]
			if l.localRope {
				cos, sin = s.cosL[t*half:(t+1)*half], s.sinL[t*half:(t+1)*half]
			}
			for h := 0; h < c.Heads && !l.noRope; h++ {
				applyRope(q[h*hd:(h+1)*hd], cos, sin)
			}
			for h := 0; h < c.KVHeads && !l.noRope; h++ {
				applyRope(k[h*hd:(h+1)*hd], cos, sin)
			}
			sq := &seqs[s.tokSeq[t]]
			pos := int(s.tokPos[t])
			tbl, ls := m.kvTable(sq, li)
			block := int(tbl[pos/layout.BlockSize])
			slot := pos % layout.BlockSize
			kv.store(layout.Offset(block, ls, 0, slot), k)
			kv.store(layout.Offset(block, ls, 1, slot), v)
			if li+1 < c.Layers && kv.f32 != nil {
				// The next layer's slots are written a layer from now:
				// fetch them meanwhile rather than stall on the write.
				// (bf16 rows are written with non-temporal stores,
				// which need no fetch.)
				ntbl, nls := m.kvTable(sq, li+1)
				nb := int(ntbl[pos/layout.BlockSize])
				kv.prefetch(layout.Offset(nb, nls, 0, slot), kvd)
				kv.prefetch(layout.Offset(nb, nls, 1, slot), kvd)
			}
		}
	})
}

func addTo(dst, src []float32) {
	for i := range dst {
		dst[i] += src[i]
	}
}

// kvTable returns the block table that addresses layer li's KV for sq and
// the layer's slot in those blocks (set by validate for this Forward).
func (m *Model) kvTable(sq *Seq, li int) ([]int32, int) {
	ls := m.s.slots[li]
	return sq.Table(ls.Group), ls.Slot
}

// kvView is the pool as f32 or bf16 elements (exactly one is set).
type kvView struct {
	f32 []float32
	u16 []uint16
}

func viewKV(pool []byte, layout kvlayout.Layout) kvView {
	if len(pool) == 0 {
		return kvView{}
	}
	if layout.DType == kvlayout.F32 {
		return kvView{f32: unsafe.Slice((*float32)(unsafe.Pointer(&pool[0])), len(pool)/4)}
	}
	return kvView{u16: unsafe.Slice((*uint16)(unsafe.Pointer(&pool[0])), len(pool)/2)}
}

// store writes row at element off, rounding to bf16 (nearest even) in a
// bf16 pool, with non-temporal stores where possible (tensor.StoreBF16).
func (kv kvView) store(off int, row []float32) {
	if kv.f32 != nil {
		copy(kv.f32[off:][:len(row)], row)
		return
	}
	tensor.StoreBF16(kv.u16[off:][:len(row)], row)
}

// prefetch asks for the n elements at off to be brought into the cache.
func (kv kvView) prefetch(off, n int) {
	if kv.f32 != nil {
		tensor.PrefetchRowsF32(kv.f32[off:], n, 1, n)
		return
	}
	tensor.PrefetchRowsU16(kv.u16[off:], n, 1, n)
}

// logits applies the final norm and the LM head to the requested rows.
func (m *Model) logits(seqs []Seq, T, R int) [][]float32 {
	c := &m.cfg
	s := &m.s
	H, V := c.Hidden, c.Vocab
	s.rows = grow(s.rows, R*H)
	s.logits = grow(s.logits, R*V)
	if cap(s.out) < len(seqs) {
		s.out = make([][]float32, len(seqs))
	}
	s.out = s.out[:len(seqs)]
	r, start := 0, 0
	for i, sq := range seqs {
		first := r
		for _, idx := range sq.Logits {
			t := start + idx
			tensor.RMSNorm(s.rows[r*H:(r+1)*H], s.x[t*H:(t+1)*H], m.finalNorm, float32(c.RMSNormEps))
			r++
		}
		s.out[i] = s.logits[first*V : r*V : r*V]
		start += len(sq.Tokens)
	}
	if R > 0 {
		m.pool.MatMul(s.logits, s.rows, R, &m.lmHead)
		if sc := c.Gemma.FinalLogitSoftcap; sc > 0 {
			softcap(s.logits[:R*V], float32(sc))
		}
	}
	return s.out
}

// validate checks a batch against the model and the pool before anything
// is written, returning the number of new tokens and of logits rows.
func (m *Model) validate(seqs []Seq, pool []byte, layout kvlayout.Layout) (T, R int, err error) {
	c := &m.cfg
	groups := m.KVGroups(false)
	want := m.KVLayoutOf(layout.BlockSize, layout.DType)
	if grouped := m.KVGroups(true); layout.Layers != want.Layers {
		groups = grouped
		want.Layers = kvlayout.PageLayers(grouped)
	}
	if layout.BlockSize <= 0 || layout != want || !layout.DType.Valid() {
		return 0, 0, fmt.Errorf("model: KV layout %+v does not match the model (want %+v, or %d layers a block with hybrid KV-cache groups, with a positive block size and dtype f32 or bf16)", layout, m.KVLayoutOf(layout.BlockSize, layout.DType), kvlayout.PageLayers(m.KVGroups(true)))
	}
	m.s.slots = kvlayout.LayerSlots(groups, c.Layers)
	blockBytes := layout.BlockBytes()
	if len(pool)%blockBytes != 0 {
		return 0, 0, fmt.Errorf("model: KV pool of %d bytes is not a whole number of %d-byte blocks", len(pool), blockBytes)
	}
	if layout.DType == kvlayout.F32 && len(pool) > 0 && uintptr(unsafe.Pointer(&pool[0]))%4 != 0 {
		return 0, 0, errors.New("model: f32 KV pool is not 4-byte aligned")
	}
	numBlocks := len(pool) / blockBytes
	if len(seqs) == 0 {
		return 0, 0, errors.New("model: Forward needs at least one sequence")
	}
	for i, sq := range seqs {
		if len(sq.Tokens) == 0 {
			return 0, 0, fmt.Errorf("model: seq %d has no new tokens", i)
		}
		end := sq.Pos + len(sq.Tokens)
		if sq.Pos < 0 || end > c.MaxModelLen() {
			return 0, 0, fmt.Errorf("model: seq %d covers positions [%d, %d), outside the model's %d positions", i, sq.Pos, end, c.MaxModelLen())
		}
		if sq.Tables != nil && len(sq.Tables) != len(groups) || sq.Tables == nil && len(groups) != 1 {
			return 0, 0, fmt.Errorf("model: seq %d has %d block tables, the pool has %d KV-cache groups", i, len(sq.Tables), len(groups))
		}
		need := (end + layout.BlockSize - 1) / layout.BlockSize
		for g, gr := range groups {
			tbl := sq.Table(g)
			if len(tbl) < need {
				return 0, 0, fmt.Errorf("model: seq %d needs %d blocks of %d slots for %d positions, block table %d has %d", i, need, layout.BlockSize, end, g, len(tbl))
			}
			first := kvlayout.FirstNeeded(gr.Window, sq.Pos) / layout.BlockSize
			for j := first; j < need; j++ {
				if b := tbl[j]; b < 0 || int(b) >= numBlocks {
					return 0, 0, fmt.Errorf("model: seq %d block table %d entry %d is block %d, outside the pool's %d blocks", i, g, j, b, numBlocks)
				}
			}
		}
		for j, id := range sq.Tokens {
			if id < 0 || int(id) >= c.Vocab {
				return 0, 0, fmt.Errorf("model: seq %d token %d is id %d, outside the vocabulary of %d", i, j, id, c.Vocab)
			}
		}
		for _, idx := range sq.Logits {
			if idx < 0 || idx >= len(sq.Tokens) {
				return 0, 0, fmt.Errorf("model: seq %d asks for logits of token %d, but it has %d new tokens", i, idx, len(sq.Tokens))
			}
		}
		T += len(sq.Tokens)
		R += len(sq.Logits)
	}
	return T, R, nil
}
