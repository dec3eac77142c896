package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestDecodePrefetchFollowsTheKernels checks a decode token's prefetch
// schedule against attendTile's loops: the kernels step it once per
// segment they read (so the prefetches stay the planned distance ahead),
// and the segments cover every key row of the chunks read and every value
// row of the window once, per KV head, a chunk's keys before its values
// and every chunk before the next. Shuffled blocks, block sizes that do and
// do not divide the key chunk, full and sliding-window attention, one item
// for all KV heads and one per KV head, rows short enough to be prefetched
// head by head and long enough to be prefetched whole, under every ISA
// (where the avx2 set's kernels prefetch, the stream they are handed holds
// the segments' pool rows in their order: see checkInKernelPrefetch), and
// the parts of a token split by key segments (of 128 keys here).
func TestDecodePrefetchFollowsTheKernels(t *testing.T) {
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		// Rows of 3·16, 3·64 and 8·128 bf16 elements: key segments head
		// by head (values the kernels do not take, and do), and for all 8
		// heads (2 KiB rows) whole.
		for _, sh := range []attnShape{{6, 3, 16}, {9, 3, 64}, {16, 8, 128}} {
			for _, bs := range []int{16, 5} {
				for _, win := range []int{0, 40, 100} {
					for _, p := range []int{0, 15, 63, 64, 130, 199} {
						for _, heads := range [][2]int{{0, sh.kvHeads}, {1, 2}} {
							testDecodePrefetch(t, isa, sh, bs, win, p, heads, attnPart{})
						}
					}
					for _, p := range []int{130, 199, 300} {
						for k := range p/128 + 1 {
							testDecodePrefetch(t, isa, sh, bs, win, p, [2]int{0, sh.kvHeads}, attnPart{k: k, n: p/128 + 1})
						}
					}
				}
			}
		}
	}
}

func testDecodePrefetch(t *testing.T, isa string, sh attnShape, bs, win, p int, heads [2]int, part attnPart) {
	const C = attnKeyChunk
	name := fmt.Sprintf("%s/%v/bs=%d/win=%d/p=%d/kvh=%d-%d", isa, sh, bs, win, p, heads[0], heads[1])
	if part.n > 0 {
		name += fmt.Sprintf("/part %d of %d", part.k, part.n)
	}
	t.Run(name, func(t *testing.T) {
		m := newAttnModel(t, sh, 1)
		m.layers[0].window = win
		if part.n > 0 {
			m.attnSeg = 128
			part.buf = make([]float32, part.n*segStride(sh.heads, sh.headDim))
		}
		r := rand.New(rand.NewPCG(uint64(bs), uint64(p)))
		f := newAttnFixture(r, m, bs, p+1, kvlayout.BF16)
		g := &m.layers[0].qkv
		s := &m.s
		s.qkv = grow(s.qkv, g.width)
		copy(s.qkv, f.q[p])
		s.attn = grow(s.attn, m.cfg.QDim())
		seqs := []Seq{{Tokens: make([]int32, 1), Pos: p, Blocks: f.blocks}}
		m.planTokens(seqs, 1)
		s.slots = kvlayout.LayerSlots(m.KVGroups(false), 1)
		w := new(attnScratch)
		m.attendTile(w, viewKV(f.pool, f.layout), f.layout, 0, &seqs[0], nil, 0, 1, p, heads[0], heads[1], part)

		// The keys the item reads: [ws, p] or its part of them.
		ws, end := part.keyRange(m.segKeys(), windowStart(p, win), p+1)
		if ws >= end {
			return
		}
		pf := &w.pf
		if pf.cur != len(pf.segs) {
			t.Fatalf("the kernels stepped %d times over %d segments", pf.cur, len(pf.segs))
		}
		if pf.next != len(pf.segs) {
			t.Fatalf("%d of %d segments prefetched", pf.next, len(pf.segs))
		}
		// Every row the schedule names, as (kv, key, KV head), in order.
		type row struct{ kv, key, kvh int }
		where := map[int]row{}
		hd := sh.headDim
		for kvi := range 2 {
			for j := 0; j <= p; j++ {
				for kvh := range sh.kvHeads {
					off := f.layout.Offset(int(f.blocks[j/bs]), 0, kvi, j%bs) + kvh*hd
					where[off] = row{kvi, j, kvh}
				}
			}
		}
		seen := map[row]bool{}
		lastChunk, lastKV := -1, 0
		for _, sg := range pf.segs {
			first, ok := where[sg.off]
			if !ok {
				t.Fatalf("segment at %d is no KV row of the sequence", sg.off)
			}
			c := first.key / C
			if c < lastChunk || (c == lastChunk && first.kv < lastKV) {
				t.Fatalf("segment %+v out of order (after chunk %d, kv %d)", first, lastChunk, lastKV)
			}
			lastChunk, lastKV = c, first.kv
			if sg.n%hd != 0 || (first.kv == 1 && sg.n != hd) {
				t.Fatalf("segment %+v of %d elements a row", first, sg.n)
			}
			if whole := first.kv == 0 && !pf.inKernel && heads[1]-heads[0] > 1 && sh.kvHeads*hd*2 > wholeKeyRows; whole != (sg.n > hd) {
				t.Fatalf("key segment %+v of %d elements a row", first, sg.n)
			}
			for i := range sg.rows {
				for h := range sg.n / hd {
					rw := row{first.kv, first.key + i, first.kvh + h}
					if rw.key/C != c || rw.key >= end || rw.kvh >= heads[1] || seen[rw] {
						t.Fatalf("segment %+v row %d: %+v outside its chunk or twice", first, i, rw)
					}
					seen[rw] = true
				}
			}
		}
		for kvh := heads[0]; kvh < heads[1]; kvh++ {
			for j := ws / C * C; j < end; j++ {
				if !seen[row{0, j, kvh}] {
					t.Fatalf("key %d of KV head %d not prefetched", j, kvh)
				}
				if j >= ws && !seen[row{1, j, kvh}] {
					t.Fatalf("value %d of KV head %d not prefetched", j, kvh)
				}
			}
		}
		if want := countRows(heads, ws, end-1); len(seen) != want {
			t.Fatalf("%d rows prefetched, want %d", len(seen), want)
		}
		if want := tensor.AttnDecodePrefetch() && heads[1]-heads[0] == sh.kvHeads; pf.inKernel != want {
			t.Fatalf("prefetches inside the kernels: %v, want %v", pf.inKernel, want)
		}
		if !pf.inKernel {
			return
		}
		// The stream: contiguous regions of whole pool rows that hold
		// the rows of the segments, in the segments' order of blocks.
		ld := f.layout.TokenElems()
		var stream []int // the stream's element offsets, one per pool row
		for _, rg := range pf.regs {
			first, ok := where[rg.off]
			if !ok || first.kvh != 0 || rg.bytes%(ld*2) != 0 {
				t.Fatalf("region %+v at %d is no run of whole pool rows of the sequence", rg, rg.off)
			}
			for i := range rg.bytes / (ld * 2) {
				stream = append(stream, rg.off+i*ld)
			}
		}
		var order []int // the segments' pool rows, in order, once
		inOrder := map[int]bool{}
		for _, sg := range pf.segs {
			for i := range sg.rows {
				o := sg.off + i*ld
				o -= o % ld // the row's start (pool rows start at multiples of ld)
				if !inOrder[o] {
					inOrder[o] = true
					order = append(order, o)
				}
			}
		}
		if !slices.Equal(stream, order) {
			t.Fatalf("the stream's rows %v, the segments' %v", stream, order)
		}
		checkInKernelPrefetch(t, pf, viewKV(f.pool, f.layout))
	})
}

// checkInKernelPrefetch replays a planned schedule whose kernels prefetch
// all they are handed: the call reading segment i is handed the offset in
// bytes from its first row to the stream's position kvStreamBytes past the
// bytes of the segments before it (0 past the stream's end), and the
// stream ends with the last call.
func checkInKernelPrefetch(t *testing.T, pf *kvPrefetch, kv kvView) {
	t.Helper()
	total := 0
	for _, rg := range pf.regs {
		total += rg.bytes
	}
	// at returns the byte address (relative to element 0) of stream
	// position pos.
	at := func(pos int) int {
		for _, rg := range pf.regs {
			if pos < rg.bytes {
				return rg.off*pf.esize + pos
			}
			pos -= rg.bytes
		}
		t.Fatalf("stream position past its end")
		return 0
	}
	pf.cur, pf.next, pf.ri, pf.rb = 0, 0, 0, 0
	read := 0
	for i, sg := range pf.segs {
		d := pf.before(kv, sg.off)
		want := 0
		if pos := read + kvStreamBytes; pos < total {
			want = at(pos) - sg.off*pf.esize
		}
		if d != want {
			t.Fatalf("segment %d: offset %d, want %d", i, d, want)
		}
		n := sg.rows * sg.n * pf.esize
		pf.after(kv, n)
		read += n
	}
	if read != total || pf.cur != len(pf.segs) || pf.ri != len(pf.regs) || pf.next != len(pf.segs) {
		t.Fatalf("after the replay: %d of %d bytes read, cur %d of %d segments, region %d of %d", read, total, pf.cur, len(pf.segs), pf.ri, len(pf.regs))
	}
}

// countRows is the number of key and value rows a decode token at position
// p with window start ws reads for KV heads [heads[0], heads[1]): keys
// from the start of ws's chunk, values from ws.
func countRows(heads [2]int, ws, p int) int {
	n := heads[1] - heads[0]
	return n * ((p + 1 - ws/attnKeyChunk*attnKeyChunk) + (p + 1 - ws))
}
