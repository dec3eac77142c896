package model

import (
	"cmp"
	"math"
	"slices"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Attention over the paged KV pool, for prefill tiles and decode tokens
// alike.
//
// # One reduction order per query
//
// A query (one head of the token at position p) attends to keys [0, p], or
// in a sliding-window layer of window W to keys [s, p] with s = max(0,
// p−W+1) (transformers' mask: key > p−W).
// Whatever else is in its tile, however its prompt was chunked into Forward
// calls and whether it is a prefill or a decode token, its output is
// computed by exactly this sequence of operations (FlashAttention's online
// softmax over fixed key chunks):
//
//  1. q̂ = q·(1/√head_dim) (Gemma 3: 1/√query_pre_attn_scalar), rounded to bf16 when the kernels round
//     activations (tensor.BF16Query; as MatMul would round it).
//  2. Keys are walked in chunks of attnKeyChunk positions, [0, 64), [64,
//     128), ..., the last one cut at p+1: chunk boundaries are positions,
//     not tiles, Forward calls or KV blocks. In a sliding-window layer the
//     walk starts at the chunk holding s and that chunk is cut at s: the
//     keys before s are never read, and each chunk's keys are a function
//     of p alone (a tile skips, token by token, the chunks that lie wholly
//     before a token's window). For each chunk c (its keys j in [s, p]):
//     s_j = q̂·k_j for every key j of the chunk, each one dot product with
//     the matmul kernel's fixed reduction order (tensor.DotRowsBF16 /
//     tensor.DotRows, bit-identical whatever the number of rows or keys per
//     call; where tensor.AttnPackedF32 holds (avx2), prefill tiles score a
//     packed, transposed f32 copy of the keys with tensor.AttnScoresF32,
//     8 keys per vector, whose every score is those kernels' bits — see
//     asmgen's attnavx2.go and TestAttnScoresF32MatchDotRows — while decode
//     tokens score the pool's key rows, over a bf16 pool with
//     tensor.AttnKeyScoresBF16, which reduces 8 keys' lane sums together
//     and gives DotRowsBF16's bits, see TestAttnKeyScoresMatchDotRowsBF16);
//     mc = the largest s_j (tensor.ArgMax); if
//     mc > m (the running maximum, -Inf before the first chunk) and m >
//     -Inf, the running sum l
//     and every accumulator element are multiplied by e^(m−mc) (one
//     tensor.ExpSum of one element); m = max(m, mc); s_j = e^(s_j−m) and
//     l += their sum (one tensor.ExpSum over the chunk's keys, its order
//     fixed by the chunk's length); acc[t] = fma(s_j, v_j[t], acc[t]) for
//     the chunk's keys j in position order (tensor.AxpyRowsBF16Group /
//     AxpyRowsGroup; splitting the rows across calls does not change the fused
//     chain).
//  3. out[t] = acc[t]·(1/l).
//
// Above the chunks, the keys are cut into key segments at multiples of
// attnSegKeys positions (512): step 2 runs from a fresh state (m = −Inf,
// l = 0, acc = 0) in every segment, each segment's (m, l, acc) is folded
// into the query's running state at its end in position order, and step 3
// normalises the running state (attention_segments.go). A query whose keys
// lie in one segment is computed exactly as above.
//
// Skipping the rescale when the maximum does not grow is exact (the factor
// would be e^0 = 1), so it is not a choice a tile could make differently.
// Keys beyond p are never read for that query (its last chunk is cut at
// p+1), so garbage in unwritten slots cannot leak in.
//
// # The bf16 path
//
// With a bf16 KV pool under an ISA with the bf16 attention kernels
// (tensor.AttnBF16: avx512bf16) the order is instead, per query (all of it
// in attention_bf16.go and the kernels of tensor/attn.go):
//
//  1. q̂ as above, rounded to bf16.
//  2. Chunks as above. For each chunk c:
//     s_j = q̂·k_j, the same bits as tensor.DotRowsBF16 gives (decode tokens
//     call it on the pool; prefill tiles score a packed copy of the keys
//     with tensor.AttnScoresBF16, 16 keys per vector, whose reduction is
//     DotRowsBF16's lane for lane and tree for tree — see asmgen's attn.go
//     and TestAttnScoresMatchDotRowsBF16);
//     one tensor.AttnSoftmaxBF16 step: mc = max_j s_j; if mc > m, l and
//     every accumulator element are multiplied by f = e^(m−mc) (when m =
//     −Inf they are +0 and stay so); m = max(m, mc); w_j = bf16(e^(s_j−m))
//     (round to nearest even); l += Σ w_j (the widened bf16 weights, summed
//     in a fixed order that depends on nothing but the weights);
//     then tensor.AttnPVBF16 over the key pairs (j, j+1), j = c0, c0+2, ...
//     in order (c0 the chunk's first key the query sees: its start, or
//     the window start s): acc[t] += w_j·v_j[t] + w_{j+1}·v_{j+1}[t] as one VDPBF16PS
//     lane, a trailing odd key paired with a zero weight and a zero value
//     (the slot after it is never read). One call takes the chunk's value
//     rows wherever their blocks are, so the pairs do not depend on the
//     block size either.
//  3. out[t] = acc[t]·(1/l).
//
// The key segments are the same as on the f32 path, and folded the same
// way.
//
// The weights are rounded to bf16 before they multiply the values, as
// FlashAttention does on GPUs (its second GEMM takes P in the input dtype);
// every other activation on this ISA is rounded to bf16 before a product
// too. l sums the rounded weights, so the output is a convex combination of
// the values with the weights actually used. Each weight carries a relative
// error of at most 2⁻⁹: against an exact float64 softmax the outputs differ
// by up to 2.8e-3 on values of unit scale (TestAttentionMatchesFloat64
// measures it); against a float64 reference that rounds the weights the
// same way, by f32 accumulation error (a few 1e-6 there) plus the rare
// weight whose f32 and float64 values round to different bf16 neighbours
// (up to 2.7e-4 in those cases; the test bounds each such weight's share).
//
// # Work split
//
// Prefill tokens are cut into tiles of up to attnTileTokens consecutive
// tokens; a work item is (tile, KV head): the tile's tokens × the GQA
// group's query heads, as one block of query rows scored against each key
// chunk in place in the pool (no gathering), chunks a tile does not need
// skipped token by token (a token scores only chunks that start at or before
// its position and end after its window start; above the diagonal nothing
// is computed, nor before a window). A single new token
// (decode) is one item for all KV heads, so one sweep reads a block's key
// rows for every head, its KV rows prefetched a fixed distance ahead of
// the kernels (attention_prefetch.go). When the batch has fewer items than
// the pool has threads (a single sequence's decode), the threads share a
// token: if its keys span more than one key segment, it is one item per
// segment (as many as full attention has; a window's fewer segments are
// dealt out among them), each for every KV head, so that each reads whole
// pool rows as one stream, and the segments' states are folded into its
// outputs once the items are done (attention_segments.go: the same folds,
// in the same order, as one thread's); a shorter token is one item per KV
// head, whose rows are a head's slices of the pool rows. Items are claimed
// dynamically by whichever pool thread is free, the costliest first within
// each KV head. On the bf16 path, and on the f32 one where
// tensor.AttnPackedF32 holds, a first parallel pass packs, per sequence
// with prefill tiles and KV head, the keys its tiles score (see packKeys,
// packKeysF32): O(keys) work that the O(keys × tokens) scoring then reads
// contiguously.

// attnTileTokens is the number of consecutive tokens of one sequence in a
// prefill work item: with a GQA group of g heads, 16·g query rows share
// every key and value row read.
const attnTileTokens = 16

// attnKeyChunk is the number of key positions per online-softmax step. It
// is part of the reduction order (changing it changes results, not their
// invariance).
const attnKeyChunk = kvlayout.KeyChunk

// attnTile is a run of at most attnTileTokens consecutive new tokens of one
// sequence.
type attnTile struct {
	t0, n int // first token (batch index) and count
}

// attnItem is one unit of attention work: a tile for one KV head, or for
// all of them (kvh < 0: a single decode token, which may also be split into
// one item per KV head, or into parts of its key segments).
type attnItem struct {
	tile, kvh   int32
	part, parts int32 // a split token's part of its key segments (parts 0: all keys)
	buf         int   // a split token's partial states in s.segBuf
	cost        int64 // query rows × keys, for ordering
}

// attnScratch is one worker's attention buffers, for R query rows.
type attnScratch struct {
	q      []float32 // scaled queries [R, hd]
	qb     tensor.BF16Query
	s      []float32 // scores, then weights, of the current chunk [R, attnKeyChunk]
	acc    []float32 // unnormalised outputs [R, hd]
	mx, l  []float32 // running maximum and sum [R]
	factor [1]float32
	// The running state the key segments' states are folded into
	// (attention_segments.go): maximum, sum [R] and unnormalised outputs
	// [R, hd].
	rm, rl, racc []float32
	runEmpty     bool // no segment folded into the running state yet
	// The bf16 path's buffers: padded bf16 queries [R, 2·AttnKeyPairs],
	// bf16 weights of the current chunk [R, attnKeyChunk], and where the
	// chunk's value rows are in the pool.
	qp, p []uint16
	voffs []int
	// A decode token's prefetch schedule (attention_prefetch.go).
	pf kvPrefetch
}

func (w *attnScratch) grow(rows, hd int) {
	w.q = grow(w.q, rows*hd)
	w.s = grow(w.s, rows*attnKeyChunk)
	w.acc = grow(w.acc, rows*hd)
	w.mx = grow(w.mx, rows)
	w.l = grow(w.l, rows)
	w.rm = grow(w.rm, rows)
	w.rl = grow(w.rl, rows)
	w.racc = grow(w.racc, rows*hd)
}

// planTokens records every new token's sequence and position, cuts the
// tokens into attention tiles and plans the attention work items.
func (m *Model) planTokens(seqs []Seq, T int) {
	s := &m.s
	s.tokSeq = growI32(s.tokSeq, T)
	s.tokPos = growI32(s.tokPos, T)
	t := 0
	s.tiles = s.tiles[:0]
	for i, sq := range seqs {
		for off := 0; off < len(sq.Tokens); off += attnTileTokens {
			s.tiles = append(s.tiles, attnTile{t0: t + off, n: min(attnTileTokens, len(sq.Tokens)-off)})
		}
		for j := range sq.Tokens {
			s.tokSeq[t] = int32(i)
			s.tokPos[t] = int32(sq.Pos + j)
			t++
		}
	}
	m.planAttention()
}

// planAttention lists the work items of the batch's tiles: prefill tiles
// per KV head, KV-head-major and costliest first within a KV head (the
// keys of one head stay in cache while its tiles run; the cheap items come
// last and even out the threads' finishing times), then the decode tokens.
func (m *Model) planAttention() {
	c := &m.cfg
	s := &m.s
	s.items = s.items[:0]
	group := int64(c.Heads / c.KVHeads)
	for kvh := range c.KVHeads {
		start := len(s.items)
		for i, tile := range s.tiles {
			if tile.n > 1 {
				keys := int64(s.tokPos[tile.t0]) + int64(tile.n)
				s.items = append(s.items, attnItem{tile: int32(i), kvh: int32(kvh), cost: keys * int64(tile.n) * group})
			}
		}
		slices.SortStableFunc(s.items[start:], func(a, b attnItem) int { return cmp.Compare(b.cost, a.cost) })
	}
	start := len(s.items)
	decode := 0
	for _, tile := range s.tiles {
		if tile.n == 1 {
			decode++
		}
	}
	// Fewer items than threads (a single sequence's decode): the threads
	// share a token's attention rather than one of them doing it while the
	// others wait. A token whose keys span several key segments is one
	// item per segment (of full attention), for every KV head, so that
	// each reads whole pool rows (attention_segments.go); a shorter one is
	// one item per KV head.
	split := start+decode < m.pool.Threads()
	S := m.segKeys()
	stride := segStride(c.Heads, c.HeadDim)
	s.segToks = s.segToks[:0]
	nbuf := 0
	for i, tile := range s.tiles {
		if tile.n != 1 {
			continue
		}
		p := int(s.tokPos[tile.t0])
		keys := int64(p) + 1
		switch nseg := p/S + 1; {
		case split && nseg > 1:
			s.segToks = append(s.segToks, segToken{tile: int32(i), buf: nbuf})
			for k := range nseg {
				n := int64(min(S, p+1-k*S))
				s.items = append(s.items, attnItem{tile: int32(i), kvh: -1, part: int32(k), parts: int32(nseg), buf: nbuf, cost: n * int64(c.Heads)})
			}
			nbuf += nseg * stride
		case split && c.KVHeads > 1:
			for kvh := range c.KVHeads {
				s.items = append(s.items, attnItem{tile: int32(i), kvh: int32(kvh), cost: keys * group})
			}
		default:
			s.items = append(s.items, attnItem{tile: int32(i), kvh: -1, cost: keys * int64(c.Heads)})
		}
	}
	s.segBuf = grow(s.segBuf, nbuf)
	slices.SortStableFunc(s.items[start:], func(a, b attnItem) int { return cmp.Compare(b.cost, a.cost) })
}

// attention computes softmax(q·Kᵀ/√d)·V for every (query head, token) of
// layer li into s.attn, over the work items planned for the batch.
func (m *Model) attention(li int, seqs []Seq, kv kvView, layout kvlayout.Layout) {
	c := &m.cfg
	s := &m.s
	items, tiles := s.items, s.tiles
	bf16, packed := useBF16Attention(kv), usePackedF32(kv)
	switch {
	case bf16:
		m.packKeys(li, seqs, kv, layout)
	case packed:
		m.packKeysF32(li, seqs, kv, layout)
	}
	m.pool.ParallelChunks(len(items), 1, func(lo, hi int) {
		w, _ := s.attnScratch.Get().(*attnScratch)
		if w == nil {
			w = new(attnScratch)
		}
		for _, it := range items[lo:hi] {
			tile := tiles[it.tile]
			sq := &seqs[s.tokSeq[tile.t0]]
			first := int(s.tokPos[tile.t0])
			kh0, kh1 := int(it.kvh), int(it.kvh)+1
			if it.kvh < 0 {
				kh0, kh1 = 0, c.KVHeads
			}
			var part attnPart
			if it.parts > 0 {
				part = attnPart{k: int(it.part), n: int(it.parts), buf: s.segBuf[it.buf:]}
			}
			if bf16 {
				var keys []uint32
				if tile.n > 1 {
					keys = s.packed[int(s.tokSeq[tile.t0])*c.KVHeads+int(it.kvh)]
				}
				m.attendTileBF16(w, kv, layout, li, sq, keys, tile.t0, tile.n, first, kh0, kh1, part)
				continue
			}
			var keys []float32
			if packed && tile.n > 1 {
				keys = s.packedF32[int(s.tokSeq[tile.t0])*c.KVHeads+int(it.kvh)]
			}
			m.attendTile(w, kv, layout, li, sq, keys, tile.t0, tile.n, first, kh0, kh1, part)
		}
		s.attnScratch.Put(w)
	})
	if len(s.segToks) > 0 {
		m.mergeParts(li)
	}
}

// attendTile computes the attention outputs of tokens [t0, t0+ntok) of the
// batch (consecutive positions first, first+1, ... of sq) for the query
// heads of KV heads [kh0, kh1), in the reduction order described at the
// top of this file and in attention_segments.go, or a split decode token's
// part of it (pt.n > 0: its segments' states left in pt.buf). Query row r
// of the item is head kvh·group+gi of token tok, r = ((kvh−kh0)·ntok +
// tok)·group + gi: the rows of one KV head are contiguous, and so are the
// group's rows of one token.
func (m *Model) attendTile(w *attnScratch, kv kvView, layout kvlayout.Layout, li int, sq *Seq, keys []float32, t0, ntok, first, kh0, kh1 int, pt attnPart) {
	tbl, ls := m.kvTable(sq, li)
	c := &m.cfg
	hd, kvd, group, bs := c.HeadDim, c.KVDim(), c.Heads/c.KVHeads, layout.BlockSize
	const C = attnKeyChunk
	S := m.segKeys()
	win := m.layers[li].window
	// The keys walked: [lo, end), end past the tile's last token's.
	lo, end := pt.keyRange(S, windowStart(first, win), first+ntok)
	if lo >= end {
		return
	}
	perHead := ntok * group // rows per KV head
	R := (kh1 - kh0) * perHead
	w.grow(R, hd)
	m.scaledQueries(w, li, t0, ntok, kh0, kh1)
	if kv.u16 != nil {
		w.qb.Set(w.q, R, hd)
	}
	w.reset(R, hd)
	w.resetRunning(R)

	decode := ntok == 1 && keys == nil
	if decode {
		w.pf.plan(layout, tbl, ls, lo, end, kh0, kh1, tensor.AttnDecodePrefetch())
	}
	segEnd := (lo/S + 1) * S
	for c0 := lo / C * C; c0 < end; c0 += C {
		if c0 == segEnd {
			w.closeSegment(R, hd, c0/S-1, pt)
			segEnd += S
		}
		c1 := min(c0+C, end)
		tokLo, tokHi := chunkTokens(c0, c1, first, ntok, win)
		live := (tokHi - tokLo) * group
		// Scores: every key of the chunk against the live rows, from the
		// packed keys (KV head kh0, the only one of a prefill item) or
		// segment by segment (a segment is the part of a KV block inside
		// the chunk).
		if keys != nil {
			r0 := tokLo * group
			tensor.AttnScoresF32(w.s[r0*C:], C, w.q[r0*hd:], hd, live, keys[c0*hd:], (c1-c0+15)/16, hd)
		}
		for j := c0; j < c1 && keys == nil; {
			blk, slot := j/bs, j%bs
			je := min(c1, (blk+1)*bs)
			base := layout.Offset(int(tbl[blk]), ls, 0, slot)
			for kvh := kh0; kvh < kh1; kvh++ {
				r0 := (kvh-kh0)*perHead + tokLo*group
				out := w.s[r0*C+(j-c0):]
				step := decode && w.pf.keyStep(kvh, kh0)
				if step && !w.pf.inKernel {
					w.pf.step(kv)
				}
				if kv.u16 != nil {
					q := w.qb.Rows(r0, live)
					k := kv.u16[base+kvh*hd:]
					if step && w.pf.inKernel {
						pf := w.pf.before(kv, base+kvh*hd)
						w.pf.after(kv, tensor.AttnKeyScoresBF16Prefetch(out, C, &q, k, kvd, je-j, pf))
					} else {
						tensor.AttnKeyScoresBF16(out, C, &q, k, kvd, je-j)
					}
					continue
				}
				for r := range live {
					tensor.DotRows(out[r*C:][:je-j], w.q[(r0+r)*hd:][:hd], kv.f32[base+kvh*hd:], kvd)
				}
			}
			j = je
		}
		// Online softmax, row by row, over the keys [ks, ke) of the
		// chunk that the row's token sees.
		for kvh := kh0; kvh < kh1; kvh++ {
			for tok := tokLo; tok < tokHi; tok++ {
				p := first + tok
				ks, ke := max(c0, windowStart(p, win)), min(c1, p+1)
				for gi := range group {
					r := (kvh-kh0)*perHead + tok*group + gi
					sc := w.s[r*C+(ks-c0):][:ke-ks]
					_, mc := tensor.ArgMax(sc)
					if mc > w.mx[r] {
						if !math.IsInf(float64(w.mx[r]), -1) {
							w.factor[0] = w.mx[r]
							f := tensor.ExpSum(w.factor[:], mc)
							w.l[r] *= f
							acc := w.acc[r*hd:][:hd]
							for i := range acc {
								acc[i] *= f
							}
						}
						w.mx[r] = mc
					}
					w.l[r] += tensor.ExpSum(sc, w.mx[r])
				}
			}
		}
		// Weighted values: the group's rows of one token share the
		// value rows and the key range.
		for kvh := kh0; kvh < kh1; kvh++ {
			for tok := tokLo; tok < tokHi; tok++ {
				p := first + tok
				r0 := (kvh-kh0)*perHead + tok*group
				ks, ke := max(c0, windowStart(p, win)), min(c1, p+1)
				for j := ks; j < ke; {
					blk, slot := j/bs, j%bs
					je := min(ke, (blk+1)*bs)
					base := layout.Offset(int(tbl[blk]), ls, 1, slot) + kvh*hd
					if decode && w.pf.inKernel {
						pf := w.pf.before(kv, base)
						w.pf.after(kv, tensor.AttnValuesBF16(group, hd, w.acc[r0*hd:], hd, w.s[r0*C+(j-c0):], C, je-j, kv.u16[base:], kvd, pf))
					} else {
						if decode {
							w.pf.step(kv)
						}
						kv.axpyGroup(group, hd, w.acc[r0*hd:], w.s[r0*C+(j-c0):], C, je-j, base, kvd)
					}
					j = je
				}
			}
		}
	}
	w.closeSegment(R, hd, (end-1)/S, pt)
	if pt.n == 0 {
		m.writeOutputs(w, t0, ntok, kh0, kh1)
	}
}

// windowStart returns the first key position a query at position p
// attends to in a layer with window win (0: full attention, from 0): p−win+1,
// or 0. It depends on nothing but p, so neither does a query's key range.
func windowStart(p, win int) int {
	if win <= 0 {
		return 0
	}
	return max(0, p-win+1)
}

// chunkTokens returns the tokens [tokLo, tokHi) of a tile (ntok consecutive
// tokens from position first) that attend to some key of the chunk [c0,
// c1): those at or after c0 whose window starts before c1.
func chunkTokens(c0, c1, first, ntok, win int) (tokLo, tokHi int) {
	tokLo, tokHi = max(0, c0-first), ntok
	if win > 0 {
		// windowStart(p) < c1 ⇔ p < c1+win−1.
		tokHi = min(ntok, c1+win-1-first)
	}
	return tokLo, tokHi
}

// scaledQueries writes into w.q the queries of tokens [t0, t0+ntok) of the
// batch for the query heads of KV heads [kh0, kh1), times 1/√head_dim
// (Gemma 3: 1/√query_pre_attn_scalar), in the item's row order (see
// attendTile).
func (m *Model) scaledQueries(w *attnScratch, li, t0, ntok, kh0, kh1 int) {
	c := &m.cfg
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	g := &m.layers[li].qkv
	perHead := ntok * group
	scale := float32(1 / math.Sqrt(float64(hd)))
	if qs := c.Gemma.QueryScalar; qs > 0 {
		scale = float32(1 / math.Sqrt(qs)) // query_pre_attn_scalar^-½
	}
	for kvh := kh0; kvh < kh1; kvh++ {
		for tok := range ntok {
			src := m.s.qkv[(t0+tok)*g.width+g.off[0]+kvh*group*hd:][:group*hd]
			dst := w.q[((kvh-kh0)*perHead+tok*group)*hd:][:group*hd]
			for i, v := range src {
				dst[i] = v * scale
			}
		}
	}
}

// reset starts the online softmax of R rows of hd outputs: running
// maximum −Inf, sum and accumulators 0.
func (w *attnScratch) reset(R, hd int) {
	negInf := float32(math.Inf(-1))
	for r := range R {
		w.mx[r], w.l[r] = negInf, 0
	}
	clear(w.acc[:R*hd])
}

// axpyGroup adds to the g output rows y[h·n:][:n] (h < g) the rows value
// rows from element off of the pool, ldv apart, weighted by
// alpha[h·lda:][:rows], in row order: tensor.AxpyRowsBF16Group (or
// AxpyRowsGroup over an f32 pool), whose every output element is one
// fused multiply-add chain over the rows.
func (kv kvView) axpyGroup(g, n int, y, alpha []float32, lda, rows, off, ldv int) {
	if kv.f32 != nil {
		tensor.AxpyRowsGroup(g, n, y, n, alpha, lda, rows, kv.f32[off:], ldv)
		return
	}
	tensor.AxpyRowsBF16Group(g, n, y, n, alpha, lda, rows, kv.u16[off:], ldv)
}

// prefetchRows asks for rows rows of n elements from element off, ld
// apart, to be brought into the cache.
func (kv kvView) prefetchRows(off, ld, rows, n int) {
	if kv.f32 != nil {
		tensor.PrefetchRowsF32(kv.f32[off:], ld, rows, n)
		return
	}
	tensor.PrefetchRowsU16(kv.u16[off:], ld, rows, n)
}
