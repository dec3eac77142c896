package model

import "github.com/tandem-serve/tandem/internal/kvlayout"

// Key packing, shared by the two paths that score prefill tiles from a
// transposed copy of the keys (attention_bf16.go, attention_packf32.go):
// which sequences and heads are packed, the work split and the walk over
// the pool's blocks; the element type and the packing kernel are the
// path's.

// packGroups is the number of 16-key groups per key-packing work item.
const packGroups = 64

// packItem is one piece of key packing: groups [g0, g1) of sequence seq's
// keys for KV head kvh.
type packItem struct {
	seq, kvh, g0, g1 int32
}

// packSeqKeys packs, for every sequence with prefill tiles (two or more new
// tokens), its keys of layer li at positions [0, Pos+len(Tokens)) per KV
// head into (*bufs)[seq·KVHeads+kvh], sized by packedLen(end, HeadDim),
// in whole groups of 16 keys (from kvlayout.FirstNeeded(window, Pos) on in
// a sliding-window layer: its tiles read none before, and its pool may
// hold no block there any more). pack(dst, j, off, n) packs the n keys from
// position j, which start at element off of the pool (each KVDim apart),
// or n zero keys when off is -1 (the last group's padding).
func packSeqKeys[T any](m *Model, li int, seqs []Seq, layout kvlayout.Layout, bufs *[][]T,
	packedLen func(end, hd int) int, pack func(dst []T, j, off, n int)) {
	c := &m.cfg
	s := &m.s
	hd, bs := c.HeadDim, layout.BlockSize
	if n := len(seqs) * c.KVHeads; len(*bufs) < n {
		*bufs = append(*bufs, make([][]T, n-len(*bufs))...)
	}
	s.packItems = s.packItems[:0]
	for i, sq := range seqs {
		if len(sq.Tokens) < 2 {
			continue
		}
		end := sq.Pos + len(sq.Tokens)
		groups := (end + 15) / 16
		for kvh := range c.KVHeads {
			b := &(*bufs)[i*c.KVHeads+kvh]
			if n := packedLen(end, hd); cap(*b) < n {
				*b = make([]T, n)
			} else {
				*b = (*b)[:n]
			}
			for g0 := 0; g0 < groups; g0 += packGroups {
				s.packItems = append(s.packItems, packItem{int32(i), int32(kvh), int32(g0), int32(min(groups, g0+packGroups))})
			}
		}
	}
	items, packed := s.packItems, *bufs
	m.pool.ParallelChunks(len(items), 1, func(lo, hi int) {
		for _, it := range items[lo:hi] {
			sq := &seqs[it.seq]
			kvh := int(it.kvh)
			dst := packed[int(it.seq)*c.KVHeads+kvh]
			end := sq.Pos + len(sq.Tokens)
			tbl, ls := m.kvTable(sq, li)
			j0 := max(int(it.g0)*16, kvlayout.FirstNeeded(m.layers[li].window, sq.Pos))
			j1 := min(int(it.g1)*16, end)
			for j := j0; j < j1; {
				blk, slot := j/bs, j%bs
				je := min(j1, (blk+1)*bs)
				pack(dst, j, layout.Offset(int(tbl[blk]), ls, 0, slot)+kvh*hd, je-j)
				j = je
			}
			if pad := int(it.g1)*16 - end; pad > 0 {
				pack(dst, end, -1, pad)
			}
		}
	})
}
