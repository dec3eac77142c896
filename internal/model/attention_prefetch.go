package model

import (
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Prefetching a decode token's KV rows.
//
// A decode token's attention reads every key and value row of its
// sequence once, from blocks scattered over the pool that the hardware
// prefetchers cannot follow from one to the next, and between two tokens
// the weights streamed through the caches have evicted them. kvPrefetch
// lists the item's rows in the order the kernels read them — per key
// chunk, the key segments (a block's rows inside the chunk) block by block
// and KV head by KV head, then the value segments KV head by KV head — and
// before each kernel call prefetches the segments that start less than
// kvPrefetchBytes past the end of the one the call reads. The prefetches
// go out a call's worth at a time beside the calls, the value rows included,
// rather than a block's key rows in one burst that stalls the core until
// its misses drain and leaves the value rows to demand misses (the scheme
// before, docs/performance-log.md "Decode attention's KV reads").
//
// Bursting, where the item's part of a pool row is long (more than
// wholeKeyRows: qwen3-0.6b's 8 KV heads of 128 in bf16, 2 KiB), a block's
// key rows are one segment for all the item's KV heads, prefetched whole:
// head by head,
// 256-byte pieces of 2 KiB rows, qwen3's decode attention was 3–12% slower
// than with whole rows, where SmolLM2's (384-byte rows) was ~10% faster
// head by head. On two threads (an item per KV head) the schedule gained
// nothing and llama-1b's attention was 5–24% slower (at most 0.8% of its
// token). Prefetches are hints: they change no result.
//
// Inside the kernels. Where the decode kernels prefetch for their caller
// (tensor.AttnDecodePrefetch: the avx2 set, over a bf16 pool) and the item
// is the token's every KV head (one thread, a batch of decode tokens, or a
// long token's part of its key segments on several threads),
// there is no burst after the first kvStreamBytes: the item's KV is a
// stream of contiguous regions (per key chunk, a block's key rows inside
// the chunk for every KV head, block by block, then the value rows the
// same way: the bytes the kernels read, in the order of the blocks they
// read them in), the stream runs kvStreamBytes ahead of the kernels, and
// every kernel call hands its kernel the offset from its rows to the
// stream's position; the kernel prefetches, one line among each step of
// its FMAs, as many consecutive bytes from there as it reads, and the
// stream moves on by as many. Bytes the kernel did not cover (a key tail
// DotRowsBF16 scores, a value call the kernels do not take, lines it ran
// past a region's end into the next block's) go out in a burst after the
// call. The burst schedule measured its prefetch instructions at ~1.3 ms
// of a 16 ms SmolLM2 token at context 2,048 (docs/performance-log.md
// "One-thread decode attention's arithmetic"): a segment's 32 prefetches
// waited on the L1 miss buffers before the kernels could start. Handed the
// same lines in the kernels' reading order (each head's slice of the rows
// a fixed distance ahead) instead of as one run of consecutive lines, the
// token was ~4% slower.
//
// The bf16 path (attendTileBF16, over the avx512bf16 set:
// tensor.AttnStreamBF16) streams the same regions in the same order: its
// key calls are attendTile's, a block's rows of one KV head, and its value
// calls read a whole key chunk of one KV head, the chunk's blocks in
// order. Its calls hand the kernels not an offset but the stream's next
// bytes as a list of runs (runs), the bytes of each region they span, so
// that no call runs past a region's end: a value call reads several
// blocks' rows. With every step of their arithmetic (a key row's 32
// elements, a pair of value rows' 32) the kernels prefetch as many lines
// from the runs as the step reads, into L2; streamed moves the stream on.
// On the AMD Zen 4 it was measured on, SmolLM2's token at context 2,048
// took 11–20% less time (docs/performance-log.md "The avx512bf16 decode
// attention streams its KV like the avx2 path").

// kvStreamBytes is how far ahead of the kernels the stream of an item's
// KV bytes runs where the kernels prefetch (see above): 8 KiB was no
// faster on the AMD Zen 2 it was measured on, 4 KiB slower.
const kvStreamBytes = 16 << 10

// kvPrefetchBytes is how far ahead of the kernels, in bytes of KV rows, a
// decode token's prefetches run (4 of SmolLM2's 16 × 64 bf16 segments):
// 16 KiB was no better on the AMD Zen 2 it was measured on.
const kvPrefetchBytes = 8 << 10

// wholeKeyRows is the longest part of a pool row, in bytes, whose key
// segments are prefetched KV head by KV head (see above).
const wholeKeyRows = 1 << 10

// kvSegment is one piece of a decode item's KV rows: rows rows of n
// elements from element off, a pool row (KVDim elements) apart; pos is the
// bytes of the pieces before it.
type kvSegment struct{ off, rows, n, pos int }

// kvPrefetch is the prefetch schedule of one decode item (see above).
type kvPrefetch struct {
	segs     []kvSegment
	next     int  // the first segment not yet prefetched
	cur      int  // the segment the kernels read next
	whole    bool // key segments span the item's KV heads (wholeKeyRows)
	inKernel bool // the kernels prefetch the stream of regs (see above)
	regs     []kvRegion
	ri, rb   int // the stream's position: byte rb of region ri
	ld       int
	esize    int
	kvs      tensor.KVStream // runs' list
}

// kvRegion is a contiguous piece of a decode item's KV: bytes bytes from
// element off.
type kvRegion struct{ off, bytes int }

// add appends the segment of rows rows of n elements from element off.
func (p *kvPrefetch) add(off, rows, n int) {
	pos := 0
	if k := len(p.segs); k > 0 {
		l := p.segs[k-1]
		pos = l.pos + l.rows*l.n*p.esize
	}
	p.segs = append(p.segs, kvSegment{off, rows, n, pos})
}

// plan lists the key and value segments of keys [ws, end) of layer slot ls
// for KV heads [kh0, kh1), in the order attendTile's decode path reads them
// (attendTileBF16's reads the same keys and values in the same order of
// blocks, a chunk's values KV head by KV head in one call each); kernels
// says whether the decode kernels prefetch the stream (see above).
func (p *kvPrefetch) plan(layout kvlayout.Layout, tbl []int32, ls, ws, end, kh0, kh1 int, kernels bool) {
	const C = attnKeyChunk
	hd, bs := layout.HeadDim, layout.BlockSize
	p.segs, p.regs = p.segs[:0], p.regs[:0]
	p.esize = layout.ElemBytes()
	p.ld = layout.TokenElems()
	p.inKernel = kernels && layout.DType == kvlayout.BF16 && kh1-kh0 == layout.KVHeads
	p.whole = !p.inKernel && (kh1-kh0)*hd*p.esize > wholeKeyRows
	region := func(blk, kv, slot, rows int) {
		if p.inKernel {
			p.regs = append(p.regs, kvRegion{layout.Offset(blk, ls, kv, slot), rows * p.ld * p.esize})
		}
	}
	for c0 := ws / C * C; c0 < end; c0 += C {
		c1 := min(c0+C, end)
		for j := c0; j < c1; {
			blk, slot := j/bs, j%bs
			je := min(c1, (blk+1)*bs)
			region(int(tbl[blk]), 0, slot, je-j)
			if p.whole {
				p.add(layout.Offset(int(tbl[blk]), ls, 0, slot)+kh0*hd, je-j, (kh1-kh0)*hd)
			} else {
				for kvh := kh0; kvh < kh1; kvh++ {
					p.add(layout.Offset(int(tbl[blk]), ls, 0, slot)+kvh*hd, je-j, hd)
				}
			}
			j = je
		}
		ks := max(c0, ws)
		for j := ks; j < c1; {
			blk, slot := j/bs, j%bs
			je := min(c1, (blk+1)*bs)
			region(int(tbl[blk]), 1, slot, je-j)
			j = je
		}
		for kvh := kh0; kvh < kh1; kvh++ {
			for j := ks; j < c1; {
				blk, slot := j/bs, j%bs
				je := min(c1, (blk+1)*bs)
				p.add(layout.Offset(int(tbl[blk]), ls, 1, slot)+kvh*hd, je-j, hd)
				j = je
			}
		}
	}
	p.next, p.cur = 0, 0
	p.ri, p.rb = 0, 0
}

// keyStep reports whether the kernels' key scores for KV head kvh of a
// block segment read a segment of the schedule of its own: every KV head
// does, unless the segments span the item's heads (then the first one).
func (p *kvPrefetch) keyStep(kvh, kh0 int) bool { return !p.whole || kvh == kh0 }

// before is called, with the kernels prefetching, before a kernel call
// reads segment cur, whose first row is at element off, and returns the
// prefetch offset in bytes to hand the kernel (0, its own rows, when there
// is nothing left to ask for): before the first call it prefetches the
// first kvStreamBytes of the stream, and it returns the offset from off to
// the stream's position. (Bursting, step is called instead.)
func (p *kvPrefetch) before(kv kvView, off int) int {
	if p.cur == 0 {
		p.advance(kv, kvStreamBytes, true)
	}
	if p.ri >= len(p.regs) {
		return 0
	}
	return (p.regs[p.ri].off-off)*p.esize + p.rb
}

// after is called after the kernel call that read segment cur with
// before's offset, covered being the bytes the kernel reports it
// prefetched from there: it moves the stream on by the segment's bytes,
// prefetching those the kernel did not cover, and moves cur on.
func (p *kvPrefetch) after(kv kvView, covered int) {
	s := p.segs[p.cur]
	n := s.rows * s.n * p.esize
	p.advance(kv, min(covered, n), false)
	p.advance(kv, n-min(covered, n), true)
	p.cur++
	if p.ri >= len(p.regs) {
		p.next = len(p.segs)
	}
}

// advance moves the stream's position on by n bytes, prefetching them if
// burst, and in any case those past the end of a region: a kernel's
// consecutive lines ran past it into bytes no call reads.
func (p *kvPrefetch) advance(kv kvView, n int, burst bool) {
	for n > 0 && p.ri < len(p.regs) {
		r := p.regs[p.ri]
		k := min(n, r.bytes-p.rb)
		if burst {
			kv.prefetchRows(r.off+p.rb/p.esize, p.ld, 1, k/p.esize)
		}
		n -= k
		if p.rb += k; p.rb == r.bytes {
			p.ri, p.rb = p.ri+1, 0
			burst = true
		}
	}
}

// runs is called, on the bf16 path with its kernels prefetching
// (tensor.AttnStreamBF16), before a kernel call that reads nb bytes: it
// returns the next nb bytes of the stream as runs of consecutive bytes
// (from a call's stream position on there is a new block every few KiB,
// and one value call reads a whole key chunk), before the first call
// prefetching the first kvStreamBytes of the stream.
func (p *kvPrefetch) runs(kv kvView, nb int) *tensor.KVStream {
	if p.cur == 0 {
		p.advance(kv, kvStreamBytes, true)
	}
	p.kvs.Reset()
	for ri, rb := p.ri, p.rb; nb > 0 && ri < len(p.regs); ri, rb = ri+1, 0 {
		r := p.regs[ri]
		k := min(nb, r.bytes-rb)
		p.kvs.Add(kv.u16[r.off+rb/p.esize:], k)
		nb -= k
	}
	return &p.kvs
}

// streamed is called after the call that was handed runs' nb bytes,
// covered being the bytes its kernel reports it prefetched from there: it
// moves the stream on by nb bytes, prefetching those the kernel did not
// cover.
func (p *kvPrefetch) streamed(kv kvView, nb, covered int) {
	c := min(covered, nb)
	for n := c; n > 0 && p.ri < len(p.regs); {
		k := min(n, p.regs[p.ri].bytes-p.rb)
		n -= k
		if p.rb += k; p.rb == p.regs[p.ri].bytes {
			p.ri, p.rb = p.ri+1, 0
		}
	}
	p.advance(kv, nb-c, true)
	p.cur++
}

// step is called before the kernels read segment cur: it prefetches the
// segments that start less than kvPrefetchBytes past cur's end and are not
// yet asked for, and moves cur on.
func (p *kvPrefetch) step(kv kvView) {
	if p.cur < len(p.segs) {
		c := p.segs[p.cur]
		lim := c.pos + c.rows*c.n*p.esize + kvPrefetchBytes
		for ; p.next < len(p.segs) && p.segs[p.next].pos < lim; p.next++ {
			s := p.segs[p.next]
			kv.prefetchRows(s.off, p.ld, s.rows, s.n)
		}
	}
	p.cur++
}
