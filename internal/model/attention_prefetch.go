package model

import "github.com/tandem-serve/tandem/internal/kvlayout"

// Prefetching a decode token's KV rows.
//
// A decode token's attention reads every key and value row of its
// sequence once, from blocks scattered over the pool that the hardware
// prefetchers cannot follow from one to the next, and between two tokens
// the weights streamed through the caches have evicted them: without help
// each segment (a KV head's rows of one block inside a key chunk) starts
// with a run of cache misses. kvPrefetch lists the segments in the order
// the kernels read them — per key chunk, the key segments block by block
// and KV head by KV head, then the value segments KV head by KV head — and
// before each kernel call prefetches the segments a fixed number of bytes
// (kvPrefetchBytes) ahead of it. The prefetches thus go out a few at a time,
// each call's worth beside the call, rather than in one burst that stalls
// the core until the misses drain, and the lines they bring in stay within
// reach of the L1 cache until they are read: a whole block's rows ahead (the
// previous scheme, 32 KiB for qwen3-0.6b's 8 KV heads of 128) evict the rows
// in use. Prefetches are hints: they change no result.

// kvPrefetchBytes is how far ahead of the kernels, in bytes of KV rows, a
// decode token's prefetches run: on the AMD Zen 2 it was measured on, 8 KiB
// took SmolLM2's decode attention ~17% below the whole-block prefetch and
// left qwen3-0.6b's unchanged (docs/performance.md, "Decode attention's KV
// reads").
const kvPrefetchBytes = 8 << 10

// kvSegment is one KV head's rows of one block inside a key chunk: rows rows
// of head_dim elements from element off, a pool row (KVDim elements) apart.
type kvSegment struct{ off, rows int }

// kvPrefetch is the prefetch schedule of one decode item (see above).
type kvPrefetch struct {
	segs  []kvSegment
	next  int // the first segment not yet prefetched
	cur   int // the segment the kernels read next
	ahead int // segments kept in flight beyond cur
	hd    int
	ld    int
}

// plan lists the key and value segments of keys [ws, end) of layer slot ls
// for KV heads [kh0, kh1), in the order attendTile's decode path reads them.
func (p *kvPrefetch) plan(layout kvlayout.Layout, tbl []int32, ls, ws, end, kh0, kh1 int) {
	const C = attnKeyChunk
	hd, bs := layout.HeadDim, layout.BlockSize
	p.segs = p.segs[:0]
	for c0 := ws / C * C; c0 < end; c0 += C {
		c1 := min(c0+C, end)
		for j := c0; j < c1; {
			blk, slot := j/bs, j%bs
			je := min(c1, (blk+1)*bs)
			for kvh := kh0; kvh < kh1; kvh++ {
				p.segs = append(p.segs, kvSegment{layout.Offset(int(tbl[blk]), ls, 0, slot) + kvh*hd, je - j})
			}
			j = je
		}
		ks := max(c0, ws)
		for kvh := kh0; kvh < kh1; kvh++ {
			for j := ks; j < c1; {
				blk, slot := j/bs, j%bs
				je := min(c1, (blk+1)*bs)
				p.segs = append(p.segs, kvSegment{layout.Offset(int(tbl[blk]), ls, 1, slot) + kvh*hd, je - j})
				j = je
			}
		}
	}
	p.next, p.cur = 0, 0
	p.ahead = max(1, kvPrefetchBytes/(bs*hd*layout.ElemBytes()))
	p.hd, p.ld = hd, layout.TokenElems()
}

// step is called before the kernels read segment cur: it prefetches the
// segments up to cur+ahead that are not yet asked for, and moves cur on.
func (p *kvPrefetch) step(kv kvView) {
	for lim := min(len(p.segs), p.cur+1+p.ahead); p.next < lim; p.next++ {
		s := p.segs[p.next]
		kv.prefetchRows(s.off, p.ld, s.rows, p.hd)
	}
	p.cur++
}
