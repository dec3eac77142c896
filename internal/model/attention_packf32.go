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
	hd, kvd := m.cfg.HeadDim, m.cfg.KVDim()
	packSeqKeys(m, li, seqs, layout, &m.s.packedF32, tensor.PackedKeysF32Len, func(dst []float32, j, off, n int) {
		switch {
		case off < 0:
			tensor.PackKeysF32(dst, j, nil, 0, n, hd)
		case kv.f32 != nil:
			tensor.PackKeysF32(dst, j, kv.f32[off:], kvd, n, hd)
		default:
			tensor.PackKeysF32FromBF16(dst, j, kv.u16[off:], kvd, n, hd)
		}
	})
}
