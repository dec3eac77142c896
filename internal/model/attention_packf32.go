package model

import (
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Prefill scores from transposed keys on the ISAs whose activations stay
// f32 (tensor.AttnPackedF32: avx2). The order of operations is the first
// contract at the top of attention.go, unchanged: tensor.AttnScoresF32
// gives, score for score, the bits tensor.DotRowsBF16 (bf16 pool) or
// tensor.DotRows (f32 pool) give, which decode tokens still call on the
// pool.

// usePackedF32 reports whether prefill tiles over kv score packed f32 keys.
func usePackedF32(kv kvView) bool { return !useBF16Attention(kv) && tensor.AttnPackedF32() }

// packKeysF32 packs, for every sequence with prefill tiles (two or more new
// tokens), its keys of layer li at positions [0, Pos+len(Tokens)) per KV
// head (from kvlayout.FirstNeeded(window, Pos) on in a sliding-window
// layer: its tiles read none before) into s.packedF32[seq·KVHeads+kvh]
// (tensor.PackKeysF32FromBF16 or PackKeysF32: 8 keys per group, whole pairs
// of groups, the last one padded with zero keys). The values are the
// pool's, widened exactly, so scoring the packed copy gives the bits
// scoring the pool gives.
func (m *Model) packKeysF32(li int, seqs []Seq, kv kvView, layout kvlayout.Layout) {
	c := &m.cfg
	s := &m.s
	hd, kvd, bs := c.HeadDim, c.KVDim(), layout.BlockSize
	if n := len(seqs) * c.KVHeads; len(s.packedF32) < n {
		s.packedF32 = append(s.packedF32, make([][]float32, n-len(s.packedF32))...)
	}
	s.packItems = s.packItems[:0]
	for i, sq := range seqs {
		if len(sq.Tokens) < 2 {
			continue
		}
		end := sq.Pos + len(sq.Tokens)
		groups := (end + 15) / 16
		for kvh := range c.KVHeads {
			b := &s.packedF32[i*c.KVHeads+kvh]
			if n := tensor.PackedKeysF32Len(end, hd); cap(*b) < n {
				*b = make([]float32, n)
			} else {
				*b = (*b)[:n]
			}
			for g0 := 0; g0 < groups; g0 += packGroups {
				s.packItems = append(s.packItems, packItem{int32(i), int32(kvh), int32(g0), int32(min(groups, g0+packGroups))})
			}
		}
	}
	items := s.packItems
	m.pool.ParallelChunks(len(items), 1, func(lo, hi int) {
		for _, it := range items[lo:hi] {
			sq := &seqs[it.seq]
			kvh := int(it.kvh)
			dst := s.packedF32[int(it.seq)*c.KVHeads+kvh]
			end := sq.Pos + len(sq.Tokens)
			tbl, ls := m.kvTable(sq, li)
			j0 := max(int(it.g0)*16, kvlayout.FirstNeeded(m.layers[li].window, sq.Pos))
			j1 := min(int(it.g1)*16, end)
			for j := j0; j < j1; {
				blk, slot := j/bs, j%bs
				je := min(j1, (blk+1)*bs)
				off := layout.Offset(int(tbl[blk]), ls, 0, slot) + kvh*hd
				if kv.f32 != nil {
					tensor.PackKeysF32(dst, j, kv.f32[off:], kvd, je-j, hd)
				} else {
					tensor.PackKeysF32FromBF16(dst, j, kv.u16[off:], kvd, je-j, hd)
				}
				j = je
			}
			if pad := int(it.g1)*16 - end; pad > 0 {
				tensor.PackKeysF32(dst, end, nil, 0, pad, hd)
			}
		}
	})
}
