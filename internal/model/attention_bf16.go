package model

import (
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// The bf16 attention path: a bf16 KV pool under an ISA with the bf16
// attention kernels (tensor.AttnBF16). Its order of operations is the
// second contract at the top of attention.go.

// useBF16Attention reports whether attention over kv takes the bf16 path.
func useBF16Attention(kv kvView) bool { return kv.u16 != nil && tensor.AttnBF16() }

// packKeys packs, for every sequence with prefill tiles (two or more new
// tokens), its keys of layer li at positions [0, Pos+len(Tokens)) per KV
// head (from kvlayout.FirstNeeded(window, Pos) on in a sliding-window
// layer: its tiles read none before) into s.packed[seq·KVHeads+kvh] (tensor.PackKeysBF16: whole groups of
// 16, the last one padded with zero keys). The bytes are the pool's, so
// scoring the packed copy gives the bits scoring the pool gives.
func (m *Model) packKeys(li int, seqs []Seq, kv kvView, layout kvlayout.Layout) {
	hd, kvd := m.cfg.HeadDim, m.cfg.KVDim()
	packSeqKeys(m, li, seqs, layout, &m.s.packed, tensor.PackedKeysLen, func(dst []uint32, j, off, n int) {
		if off < 0 {
			tensor.PackKeysBF16(dst, j, nil, 0, n, hd)
		} else {
			tensor.PackKeysBF16(dst, j, kv.u16[off:], kvd, n, hd)
		}
	})
}

// attendTileBF16 is attendTile on the bf16 path: keys nil for a decode
// token (KV heads [kh0, kh1), scores by tensor.DotRowsBF16 straight from
// the pool; a split one's part pt of its key segments), else the packed
// keys of KV head kh0 of the tile's sequence (kh1 = kh0+1).
func (m *Model) attendTileBF16(w *attnScratch, kv kvView, layout kvlayout.Layout, li int, sq *Seq, keys []uint32, t0, ntok, first, kh0, kh1 int, pt attnPart) {
	tbl, ls := m.kvTable(sq, li)
	c := &m.cfg
	hd, kvd, group, bs := c.HeadDim, c.KVDim(), c.Heads/c.KVHeads, layout.BlockSize
	const C = attnKeyChunk
	S := m.segKeys()
	win := m.layers[li].window
	lo, end := pt.keyRange(S, windowStart(first, win), first+ntok)
	if lo >= end {
		return
	}
	perHead := ntok * group
	R := (kh1 - kh0) * perHead
	w.grow(R, hd)
	// A row's weights start up to C−1 keys into its C slots (at its
	// window start) and AttnSoftmaxBF16 zeroes C slots after that start:
	// one row of slack.
	w.p = growU16(w.p, (R+1)*C)
	if w.voffs == nil {
		w.voffs = make([]int, C)
	}
	m.scaledQueries(w, li, t0, ntok, kh0, kh1)
	P2 := 2 * tensor.AttnKeyPairs(hd) // a padded query row
	if keys != nil {
		// Rounded as BF16Query.Set rounds (one ToBF16 per element).
		w.qp = growU16(w.qp, R*P2)
		for r := range R {
			row := w.qp[r*P2 : (r+1)*P2]
			tensor.ToBF16(row[:hd], w.q[r*hd:(r+1)*hd])
			clear(row[hd:])
		}
	} else {
		w.qb.Set(w.q, R, hd)
	}
	w.reset(R, hd)
	w.resetRunning(R)
	// A decode token's KV, where the item is its every KV head, is a
	// stream that the kernels prefetch ahead of their reads
	// (attention_prefetch.go); elsewhere a block's key rows are
	// prefetched while the block before is scored.
	stream := false
	if keys == nil && kh1-kh0 == c.KVHeads && tensor.AttnStreamBF16() {
		w.pf.plan(layout, tbl, ls, lo, end, kh0, kh1, true)
		stream = w.pf.inKernel
	}

	segEnd := (lo/S + 1) * S
	for c0 := lo / C * C; c0 < end; c0 += C {
		if c0 == segEnd {
			w.closeSegment(R, hd, c0/S-1, pt)
			segEnd += S
		}
		c1 := min(c0+C, end)
		tokLo, tokHi := chunkTokens(c0, c1, first, ntok, win)
		if keys != nil {
			r0, live := tokLo*group, (tokHi-tokLo)*group
			tensor.AttnScoresBF16(w.s[r0*C:], C, w.qp[r0*P2:], P2, live, keys[c0/16*16*(P2/2):], (c1-c0+15)/16, hd)
		} else {
			for j := c0; j < c1; {
				blk, slot := j/bs, j%bs
				je := min(c1, (blk+1)*bs)
				base := layout.Offset(int(tbl[blk]), ls, 0, slot)
				if je < end && !stream {
					nb, ns := je/bs, je%bs
					next := layout.Offset(int(tbl[nb]), ls, 0, ns) + kh0*hd
					kv.prefetchRows(next, kvd, min(bs-ns, end-je), (kh1-kh0)*hd)
				}
				for kvh := kh0; kvh < kh1; kvh++ {
					r0 := (kvh - kh0) * perHead
					q := w.qb.Rows(r0, perHead)
					out, k := w.s[r0*C+(j-c0):], kv.u16[base+kvh*hd:]
					if stream {
						nb := (je - j) * hd * 2
						s := w.pf.runs(kv, nb)
						w.pf.streamed(kv, nb, tensor.DotRowsBF16Stream(out, C, &q, k, kvd, je-j, s))
					} else {
						tensor.DotRowsBF16(out, C, &q, k, kvd, je-j)
					}
				}
				j = je
			}
		}
		// Where the chunk's value rows are (KV head kh0's columns).
		for j := c0; j < c1; {
			blk, slot := j/bs, j%bs
			je := min(c1, (blk+1)*bs)
			off := layout.Offset(int(tbl[blk]), ls, 1, slot) + kh0*hd
			for k := j; k < je; k++ {
				w.voffs[k-c0] = off
				off += kvd
			}
			j = je
		}
		if ntok == 1 {
			// A decode token: every KV head's rows see the same keys
			// [ks, c1) of the chunk.
			ks := max(c0, lo) - c0
			attnSoftmax(w, 0, R, ks, c1-c0-ks, hd)
			for kvh := kh0; kvh < kh1; kvh++ {
				r0, voff := (kvh-kh0)*perHead, (kvh-kh0)*hd
				if !stream {
					attnValues(w, kv, r0, perHead, ks, c1-c0-ks, voff, hd, nil)
					continue
				}
				nb := (c1 - c0 - ks) * hd * 2
				s := w.pf.runs(kv, nb)
				w.pf.streamed(kv, nb, attnValues(w, kv, r0, perHead, ks, c1-c0-ks, voff, hd, s))
			}
			continue
		}
		// Tokens [tokFull, fullHi) see the whole chunk and share one
		// call; the others (on the diagonal, or whose window starts inside
		// the chunk) see fewer keys each.
		tokFull, fullHi := max(tokLo, c1-1-first), tokHi
		if win > 0 {
			// windowStart(p) ≤ c0 ⇔ p ≤ c0+win−1.
			fullHi = min(tokHi, c0+win-first)
		}
		if tokFull < fullHi {
			r0, rows := tokFull*group, (fullHi-tokFull)*group
			attnSoftmax(w, r0, rows, 0, c1-c0, hd)
			attnValues(w, kv, r0, rows, 0, c1-c0, 0, hd, nil)
		}
		for tok := tokLo; tok < tokHi; tok++ {
			if tok >= tokFull && tok < fullHi {
				continue
			}
			p := first + tok
			ks, ke := max(c0, windowStart(p, win)), min(c1, p+1)
			r0 := tok * group
			attnSoftmax(w, r0, group, ks-c0, ke-ks, hd)
			attnValues(w, kv, r0, group, ks-c0, ke-ks, 0, hd, nil)
		}
	}
	w.closeSegment(R, hd, (end-1)/S, pt)
	if pt.n == 0 {
		m.writeOutputs(w, t0, ntok, kh0, kh1)
	}
}

// attnSoftmax runs the online-softmax step of query rows [r0, r0+rows) of
// the scratch over the n keys of the chunk from key off (their scores in
// w.s), leaving their bf16 weights in w.p from off on.
func attnSoftmax(w *attnScratch, r0, rows, off, n, hd int) {
	const C = attnKeyChunk
	tensor.AttnSoftmaxBF16(w.s[r0*C+off:], C, rows, n, w.mx[r0:], w.l[r0:], w.acc[r0*hd:], hd, hd, w.p[r0*C+off:], C)
}

// attnValues adds the values of the n keys of the chunk from key off
// (value rows at w.voffs, plus voff for the KV head's columns) weighted by
// w.p to the accumulators of query rows [r0, r0+rows). One call covers the
// keys wherever their blocks are, so the key pairs, and so every
// accumulator's VDPBF16PS steps, are the same whatever the block size.
// With s set its kernel also prefetches s (tensor.AttnPVBF16Stream), and
// it returns the bytes prefetched.
func attnValues(w *attnScratch, kv kvView, r0, rows, off, n, voff, hd int, s *tensor.KVStream) int {
	const C = attnKeyChunk
	u16 := kv.u16[voff:]
	if s != nil {
		return tensor.AttnPVBF16Stream(w.acc[r0*hd:], hd, w.p[r0*C+off:], C, rows, u16, w.voffs[off:off+n], n, hd, s)
	}
	tensor.AttnPVBF16(w.acc[r0*hd:], hd, w.p[r0*C+off:], C, rows, u16, w.voffs[off:off+n], n, hd)
	return 0
}

func growU16(b []uint16, n int) []uint16 {
	if cap(b) < n {
		return make([]uint16, n)
	}
	return b[:n]
}
