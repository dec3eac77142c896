package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowStreamsAVX2 is the number of weight rows the AVX2 row kernels of
// the 32-blocks (Q8_0, Q4_0, Q5_0) read side by side in phase 1, and
// rowStreamsKAVX2 that of the K-quant ones. On the Zen 2 they were tuned
// on (EPYC, family 23 model 49) one core reads one sequential stream at
// only ~15 GB/s, software prefetch or not, but several streams a few
// kilobytes apart at ~20–24 GB/s (tensor.ReadScan at 1, 2, 4 and 8
// streams: the L2's stream prefetchers run ahead in each at once), the
// opposite of the Zen 4 the one-row-at-a-time order was chosen on (see
// rowquant.go), which the AVX-512 kernels keep.
//
// The streams are lds bytes apart, a kernel parameter: package tensor's
// driver splits a thread's rows into that many regions and gives each
// call the next rows of every region, so that each stream runs on
// sequentially from one call to the next (it was the rows r and
// r + rows/2 of one call, 8 rows, whose streams jumped ahead at every
// call). With the regions, four streams took the cold Q8_0 decode kernel
// on one thread from 12.3–12.6 to 14.7–17.2 GB/s (two: 14.5–15.8, eight:
// 12.3–12.6), and two the K-quants' from 10.2–11.8 to 11.9–12.7 (one
// region of rows at a time before; four and eight were slower:
// docs/performance.md). Every dtype now reads most rows with row8AVX2,
// row8Q6KAVX2 or row8Q4KAVX2 (8 regions, below), whose loops have none of
// phase 2's work; these kernels take the rows left over (fewer than 8 per
// thread's share).
const (
	rowStreamsAVX2  = 4
	rowStreamsKAVX2 = 2
)

// setStreams sets the rows phase 1 reads side by side: n with AVX2, one
// at a time with AVX-512.
func (k *rowKern) setStreams(n int) {
	if !k.avx512 {
		k.streams = n
	}
}

// phase1Streams is phase1 for k.streams > 1: with q = rows / k.streams,
// the call's rows s·q + i (s < k.streams, i < q), at w + s·lds + i·ldw,
// are read side by side, a group of blocks of each stream in turn, for
// i < q; the rows past streams·q (a call of fewer rows than usual) follow
// one at a time after the last stream's. The groups, bodies and scratch
// slots are phase1's, so the results are the same bit for bit.
func (k *rowKern) phase1Streams(elems, bytes int, body func(wq, xq, b, slot GPVirtual)) {
	ways := k.streams
	w := Load(Param("w"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64()).(GPVirtual)
	k.nb = nb
	// Stack: the rows left of the current loop, the distance of two
	// streams in the weights and in the scratch, and the scratch back from
	// the last stream to the first.
	rowsLeft, wStride, sStride, sBack := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	rows := Load(Param("rows"), GP64()).(GPVirtual)
	q := GP64()
	MOVQ(rows, q)
	SHRQ(U8(log2(ways)), q)
	t := GP64()
	MOVQ(paramMem("lds"), t)
	MOVQ(t, wStride)
	// A row's scratch: slotBytes apart in the transposed layout, a
	// slot per group apart otherwise.
	MOVQ(q, t)
	if k.transposed {
		SHLQ(U8(log2(k.slotBytes())), t)
	} else {
		g := GP64()
		MOVQ(nb, g)
		ADDQ(U32(k.group-1), g)
		SHRQ(U8(log2(k.group)), g)
		IMULQ(g, t)
		SHLQ(U8(log2(k.slotBytes())), t)
	}
	MOVQ(t, sStride)
	IMUL3Q(U32(ways-1), t, t)
	MOVQ(t, sBack)
	slot := Load(Param("scratch"), GP64()).(GPVirtual)
	var srow GPVirtual
	if k.transposed {
		srow = GP64()
		MOVQ(slot, srow)
	}
	loop := func(p string, ways int) {
		Label(p + "row")
		if k.transposed {
			MOVQ(srow, slot)
		}
		b8 := GP64()
		XORQ(b8, b8)
		Label(p + "group")
		// b = min(b8, nb − group)
		b := GP64()
		MOVQ(nb, b)
		SUBQ(U32(k.group), b)
		CMPQ(b8, b)
		CMOVQLT(b8, b)
		wq, xq := GP64(), GP64()
		IMUL3Q(U32(bytes), b, wq)
		ADDQ(w, wq)
		MOVQ(b, xq)
		SHLQ(U8(log2(elems)), xq)
		ADDQ(paramMem("x"), xq)
		for s := range ways {
			if s > 0 {
				ADDQ(wStride, wq)
				ADDQ(sStride, slot)
			}
			for off := 0; off < k.group*bytes+63; off += 64 {
				PREFETCHT0(Mem{Base: wq, Disp: rowPfDist + off})
			}
			body(wq, xq, b, slot)
		}
		if ways > 1 {
			SUBQ(sBack, slot)
		}
		if k.transposed {
			ADDQ(U32(qRowMax*k.slotBytes()), slot)
		} else {
			ADDQ(U32(k.slotBytes()), slot)
		}
		ADDQ(U32(k.group), b8)
		CMPQ(b8, nb)
		JB(LabelRef(p + "group"))
		ADDQ(paramMem("ldw"), w)
		if k.transposed {
			ADDQ(U32(k.slotBytes()), srow)
		}
		DECQ(rowsLeft)
		JNE(LabelRef(p + "row"))
	}
	TESTQ(q, q)
	JE(LabelRef("singles"))
	MOVQ(q, rowsLeft)
	loop("s", ways)
	// Past the rows the streams read: w and the scratch move on by the
	// other streams' rows.
	ADDQ(sBack, func() GPVirtual {
		if k.transposed {
			return srow
		}
		return slot
	}())
	MOVQ(wStride, t)
	IMUL3Q(U32(ways-1), t, t)
	ADDQ(t, w)
	Label("singles")
	r := Load(Param("rows"), GP64()).(GPVirtual)
	ANDQ(U32(ways-1), r)
	JE(LabelRef("phase1done"))
	MOVQ(r, rowsLeft)
	loop("", 1)
	Label("phase1done")
	if ways&(ways-1) != 0 || ways > qRowMax {
		panic(fmt.Sprintf("%d row streams: not a power of 2 up to %d", ways, qRowMax))
	}
}

// row8AVX2 emits the AVX2 row kernel of Q8_0, Q4_0 or Q5_0 (q.bytes 34,
// 18, 22) that reads 8 streams, one row each: rows s (s < 8) at
// w + s·lds, block b of all 8 rows in one step. The 8 rows' block-b
// vectors (row32's per-block work: the sign trick for Q8_0, the nibbles,
// with their fifth bits for Q5_0) reduce by one tree to a vector whose
// lane s is row s's exact integer (plus the correction of the unsigned
// levels, the same for every row), so the chains of the definition (one
// FMA per block, in block order) run in the lanes of one accumulator
// inside the loop: no scratch, no transposes, no second phase, and one
// load of the activation block for the 8 rows. On the Zen 2 this took the
// Q8_0 kernel from 23–26 to 32–35 GB/s in cache and, cold, from 15–17 to
// 16–18 GB/s on one thread (two threads: 28–32 of a 32 GB/s limit); a software prefetch of each row 1, 4 or 8 KiB
// ahead made it slower (4 and 8 KiB: 11–12 GB/s), so it has none: the 8
// sequential streams are what the L2's prefetchers follow best
// (docs/performance.md).
func row8AVX2(q quant32) {
	k := &rowKern{group: 8}
	name := "qrow8" + q.name + "AVX2"
	TEXT(name, NOSPLIT, "func(w *byte, lds int, nb int, x *int8, aux *uint32, out *float32)")
	Doc(fmt.Sprintf("%s computes 8 %s weight rows lds bytes apart times one activation row (see asmgen's rowstreams.go).", name, q.name))
	signed := q.bytes == 34
	ones := k.splatY(0x00010001)
	var c0f, shift, qhSpread, bits, c10 VecVirtual
	if !signed {
		c0f = k.splatY(0x0f0f0f0f)
		shift = YMM()
		k.movdqu(table("shr0x4x4", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0}), shift)
	}
	if q.bytes == 22 {
		var sp, bt []byte
		for t := range 32 {
			sp = append(sp, byte(t/8))
			bt = append(bt, byte(1<<(t%8)))
		}
		qhSpread = YMM()
		k.movdqu(table("q5spreadb", sp), qhSpread)
		bits = YMM()
		k.movdqu(table("q5bits", bt), bits)
		c10 = k.splatY(0x10101010)
	}
	w := Load(Param("w"), GP64()).(GPVirtual)
	lds := Load(Param("lds"), GP64()).(GPVirtual)
	rows := newRows8(w, lds)
	n := Load(Param("nb"), GP64()).(GPVirtual)
	x := Load(Param("x"), GP64()).(GPVirtual)
	aux := Load(Param("aux"), GP64()).(GPVirtual)
	var corr GPVirtual
	if !signed {
		// The corrections follow the nb activation scales in aux.
		corr = GP64()
		LEAQ(Mem{Base: aux, Index: n, Scale: 4}, corr)
	}
	acc := ymmZero()
	Label("block")
	xv := YMM()
	VMOVDQU(Mem{Base: x}, xv)
	dot := func(r int) VecVirtual {
		p := YMM()
		if signed {
			wv, av, xs := YMM(), YMM(), YMM()
			VMOVDQU(rows.at(r, 2), wv)
			VPABSB(wv, av)
			VPSIGNB(wv, xv, xs)
			VPMADDUBSW(xs, av, xs)
			VPMADDWD(ones, xs, p)
			return p
		}
		qs := 2
		if q.bytes == 22 {
			qs = 6
		}
		v := YMM()
		VBROADCASTI128(rows.at(r, qs), v)
		VPSRLVD(shift, v, v)
		VPAND(c0f, v, v)
		if q.bytes == 22 {
			h := YMM()
			VPBROADCASTD(rows.at(r, 2), h)
			VPSHUFB(qhSpread, h, h)
			VPAND(bits, h, h)
			VPCMPEQB(bits, h, h)
			VPAND(c10, h, h)
			VPOR(h, v, v)
		}
		VPMADDUBSW(xv, v, v)
		VPMADDWD(ones, v, p)
		return p
	}
	var p [8]VecVirtual
	for r := range 4 {
		p[r] = dot(r)
	}
	lo := k.tree4x2(p[:4])
	for r := 4; r < 8; r++ {
		p[r] = dot(r)
	}
	hi := k.tree4x2(p[4:])
	c := joinHalves(lo, hi)
	if !signed {
		cv := YMM()
		VPBROADCASTD(Mem{Base: corr}, cv)
		VPADDD(cv, c, c)
	}
	f := YMM()
	VCVTDQ2PS(c, f)
	// The 8 rows' f16 scales of block b, widened, times the activation's.
	rows.fmaScales(0, aux, f, acc)
	rows.advance(q.bytes)
	ADDQ(U8(32), x)
	ADDQ(U8(4), aux)
	if !signed {
		ADDQ(U8(4), corr)
	}
	DECQ(n)
	JNE(LabelRef("block"))
	storeRows8(acc)
}

// storeRows8 stores the 8 rows' sums (acc's lanes) to out and returns.
func storeRows8(acc VecVirtual) {
	out := Load(Param("out"), GP64()).(GPVirtual)
	VMOVUPS(acc, Mem{Base: out})
	VZEROUPPER()
	RET()
}

// nextSuperBlock moves the K-quant 8-row kernels on by one super-block:
// the 8 rows' pointers by bytes, the activation by its 256 values (x),
// their sums per 32 (meta) and scale (aux), and loops while n counts.
func nextSuperBlock(rows rows8, bytes int, x, meta, aux, n GPVirtual) {
	rows.advance(bytes)
	ADDQ(U32(256), x)
	ADDQ(U8(64), meta)
	ADDQ(U8(4), aux)
	DECQ(n)
	JNE(LabelRef("super"))
}

// joinHalves adds the 128-bit halves of lo (rows 0–3's integers in each
// half) and hi (rows 4–7's) into one vector whose lane s is row s's.
func joinHalves(lo, hi VecVirtual) VecVirtual {
	s, t := YMM(), YMM()
	VPERM2I128(U8(0x20), hi, lo, s)
	VPERM2I128(U8(0x31), hi, lo, t)
	VPADDD(t, s, s)
	return s
}

// fmaScales adds f times the 8 rows' f16 scales at disp (widened, lane s
// row s's) times the activation's scale at aux to acc: one FMA of each
// row's chain.
func (r rows8) fmaScales(disp int, aux GPVirtual, f, acc VecVirtual) {
	s0, s1 := GP64(), GP64()
	for h, q := range []GPVirtual{s0, s1} {
		MOVWQZX(r.at(4*h+3, disp), q)
		for i := 2; i >= 0; i-- {
			SHLQ(U8(16), q)
			MOVW(r.at(4*h+i, disp), q.As16())
		}
	}
	hx := XMM()
	VMOVQ(s0, hx)
	VPINSRQ(U8(1), s1, hx, hx)
	g, dx := YMM(), YMM()
	VCVTPH2PS(hx, g)
	VBROADCASTSS(Mem{Base: aux}, dx)
	VMULPS(dx, g, g)
	VFMADD231PS(f, g, acc)
}

// row8Q6KAVX2 emits the AVX2 Q6_K row kernel of 8 streams, one row each
// (rows s < 8 at w + s·lds), a super-block of all 8 rows a step, as
// row8AVX2 does the 32-blocks: the 8 rows' partial sums (q6kSuper) reduce
// to a vector whose lane s is row s's exact integer, and the chains (one
// FMA per super-block) run in the lanes of one accumulator. Its masks are
// memory operands: the super-block's work needs the registers. On the Zen 2
// it took Q6_K from 20–23 to 25 GB/s in cache and, cold, from 12.4–13.5 to
// 14.0–16.4 GB/s on one thread (CPU time) and 15–18 to 21–29 on two.
func row8Q6KAVX2() {
	k := &rowKern{group: 4}
	const bytes = 210
	TEXT("qrow8Q6_KAVX2", NOSPLIT, "func(w *byte, lds int, nb int, x *int8, meta *uint32, aux *uint32, out *float32)")
	Doc("qrow8Q6_KAVX2 computes 8 Q6_K weight rows lds bytes apart times one activation row (see asmgen's rowstreams.go).")
	c := k.q6kConsts8()
	w := Load(Param("w"), GP64()).(GPVirtual)
	lds := Load(Param("lds"), GP64()).(GPVirtual)
	rows := newRows8(w, lds)
	n := Load(Param("nb"), GP64()).(GPVirtual)
	x := Load(Param("x"), GP64()).(GPVirtual)
	meta := Load(Param("meta"), GP64()).(GPVirtual)
	aux := Load(Param("aux"), GP64()).(GPVirtual)
	acc := ymmZero()
	Label("super")
	half := func(r0 int) VecVirtual {
		var z [4]VecVirtual
		for r := range 4 {
			z[r] = k.q6kSuper(c, func(d int) Mem { return rows.at(r0+r, d) },
				func(d int) Mem { return Mem{Base: x, Disp: d} }, Mem{Base: meta, Disp: metaSums16})
		}
		return k.tree4x2(z[:])
	}
	lo := half(0)
	hi := half(4)
	s := joinHalves(lo, hi)
	f := YMM()
	VCVTDQ2PS(s, f)
	rows.fmaScales(208, aux, f, acc)
	nextSuperBlock(rows, bytes, x, meta, aux, n)
	storeRows8(acc)
}

// row8Q4KAVX2 emits the AVX2 Q4_K (with five, Q5_K) row kernel of 8
// streams, one row each (rows s < 8 at w + s·lds), a super-block of all 8
// rows a step, as row8Q6KAVX2 does Q6_K. Per super-block:
//
//   - the 6-bit scales and mins of two rows at once (rows i and i + 4, one
//     per 128-bit half) unpacked by vector ops from the 16 bytes d, dmin,
//     scales: two VPSHUFBs gather the bytes each scale and min is made of,
//     a VPSRLVD, a VPSRLW, two ANDs and an OR put the bits in place (see
//     k4Unpack); the scales widened to words (Q4_K) or spread to (sc, sc)
//     word pairs (Q5_K) in a stack slot, the mins times the activation's
//     sums per 32 by VPMADDWD, reduced by one tree to the 8 rows' M in the
//     lanes of one vector; the d|dmin dwords of the 8 rows gathered by
//     unpacks into one vector;
//   - per row, the dot products (the levels times the activations by
//     VPMADDUBSW, times the scales by VPMADDWD: see dot), the 8 rows'
//     partial sums reduced to the 8 rows' I in the lanes of one vector;
//   - the definition's two chains per super-block, fma(I, d·dy) then
//     fma(−M, dmin·dy), in the lanes of one accumulator.
//
// No scratch, no phase 2, no GP work per row but the addresses. Like
// row8Q6KAVX2 it has no software prefetch: with the 8 streams spread over
// the cache sets (package tensor's row8Regions), prefetching every line of
// each row's super-block 512 bytes, 1 KiB or 2 KiB ahead made Q4_K, Q5_K
// and Q6_K 0–10%, 10–20% and 15–30% slower cold on one thread, and 4
// regions read two adjacent rows abreast (rows 4–7 the rows after 0–3)
// halved the rate (docs/performance.md, "K-quant single-stream decode:
// stream count and prefetch re-measured"). On the Zen 2, with the weights
// in L1, it runs at 22–24 GB/s against the two-phase kernel's 16 (Q4_K:
// 22 cycles a row's super-block, of which the dot products' 12 multiplies
// and ~35 other vector ops take most; unpacking the scales and mins ~12%).
func row8Q4KAVX2(five bool) {
	k := &rowKern{group: 4}
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow8" + nm + "AVX2"
	TEXT(name, NOSPLIT, "func(w *byte, lds int, nb int, x *int8, meta *uint32, aux *uint32, out *float32)")
	Doc(fmt.Sprintf("%s computes 8 %s weight rows lds bytes apart times one activation row (see asmgen's rowstreams.go).", name, nm))
	c0f := k.splatY(0x0f0f0f0f)
	var c10 Op
	if five {
		var b []byte
		for range 32 {
			b = append(b, 0x10)
		}
		c10 = table("rowc10", b)
	}
	u := k4UnpackTables()
	w := Load(Param("w"), GP64()).(GPVirtual)
	lds := Load(Param("lds"), GP64()).(GPVirtual)
	rows := newRows8(w, lds)
	n := Load(Param("nb"), GP64()).(GPVirtual)
	x := Load(Param("x"), GP64()).(GPVirtual)
	meta := Load(Param("meta"), GP64()).(GPVirtual)
	aux := Load(Param("aux"), GP64()).(GPVirtual)
	// Stack: Q4_K's scale words (32 bytes per two rows: rows i and i + 4's
	// sc₀..sc₇) or Q5_K's scale pairs (64 bytes per two rows: rows i and
	// i + 4's (sc, sc) pairs of scales 0..3, then of 4..7), then −M as f32
	// and the products dmin·dy and d·dy of the super-block.
	sb := 128
	if five {
		sb = 256
	}
	stash := AllocLocal(sb + 96)
	wordAt := func(r, c int) Mem { return stash.Offset(32*(r%4) + 16*(r/4) + 4*c) }
	pairAt := func(r, j int) Mem {
		return stash.Offset(64*(r%4) + 32*(j/4) + 16*(r/4) + 4*(j%4))
	}
	negM, sM, sD := stash.Offset(sb), stash.Offset(sb+32), stash.Offset(sb+64)
	acc := ymmZero()
	Label("super")
	// The scales and mins of rows i and i + 4, and the 8 rows' d|dmin.
	bs := YMM()
	VBROADCASTI128(Mem{Base: meta, Disp: metaSums32}, bs)
	var mv [4]VecVirtual
	var dd [2]VecVirtual
	for p := range 2 {
		var hv [2]VecVirtual
		for h := range 2 {
			i := 2*p + h
			hv[h] = YMM()
			VMOVDQU(rows.at(i, 0), hv[h].AsX())
			VINSERTI128(U8(1), rows.at(i+4, 0), hv[h], hv[h])
			sc := k4Unpack(u, hv[h])
			if five {
				lo, hi := YMM(), YMM()
				VPSHUFB(u.pairLo, sc, lo)
				VPSHUFB(u.pairHi, sc, hi)
				VMOVDQU(lo, stash.Offset(64*i))
				VMOVDQU(hi, stash.Offset(64*i+32))
			} else {
				sw := YMM()
				VPSHUFB(u.scWords, sc, sw)
				VMOVDQU(sw, stash.Offset(32*i))
			}
			VPSHUFB(u.minWords, sc, sc)
			mv[i] = YMM()
			VPMADDWD(bs, sc, mv[i])
		}
		dd[p] = YMM()
		VPUNPCKLDQ(hv[1], hv[0], dd[p])
	}
	// dw: the 8 rows' d|dmin dwords, row s in lane s.
	dw := YMM()
	VPUNPCKLQDQ(dd[1], dd[0], dw)
	mt := tree4(mv[:], YMM)
	mf := YMM()
	VCVTDQ2PS(mt, mf)
	VXORPS(u.sign, mf, mf)
	VMOVUPS(mf, negM)
	// d₀..d₃ dmin₀..dmin₃ | d₄..d₇ dmin₄..dmin₇, then d₀..d₇ dmin₀..dmin₇.
	VPSHUFB(u.dSplit, dw, dw)
	VPERMQ(U8(0b11011000), dw, dw)
	dy := YMM()
	VBROADCASTSS(Mem{Base: aux}, dy)
	dm := YMM()
	VCVTPH2PS(k.extractHi(dw), dm)
	VMULPS(dy, dm, dm)
	VMOVUPS(dm, sM)
	sd := YMM()
	VCVTPH2PS(dw.AsX(), sd)
	VMULPS(dy, sd, sd)
	VMOVUPS(sd, sD)
	// The levels of row r times the activations and the scales: 8 dword
	// partial sums of I. Each sub-block's 16 int16 pair sums by
	// VPMADDUBSW; Q5_K's times their scale pair by VPMADDWD, one per
	// sub-block as rowQ4K does; Q4_K's of sub-blocks 2c and 2c + 1 first
	// summed two pairs to a word (at most 4·15·127 = 7,620: exact), the
	// first sub-block's in the low word of each dword, the other's in the
	// high (an unpack each way and a VPADDW), then one VPMADDWD by
	// (sc₂c, sc₂c₊₁) for both: 12 multiplies a row instead of 16, for 8
	// more shuffles; Q5_K, with 7 more shifts a row for its fifth bits,
	// ran 3% slower so, Q4_K 11% faster (docs/performance.md).
	dot := func(r int) VecVirtual {
		blk := func(d int) Mem { return rows.at(r, d) }
		var qh VecVirtual
		if five {
			qh = YMM()
			VMOVDQU(blk(16), qh)
		}
		var ac [2]VecVirtual
		for c := range 4 {
			lo, hi := YMM(), YMM()
			VMOVDQU(blk(qs+32*c), hi)
			VPAND(c0f, hi, lo)
			VPSRLW(U8(4), hi, hi)
			VPAND(c0f, hi, hi)
			var p [2]VecVirtual
			for h, v := range []VecVirtual{lo, hi} {
				if five {
					// Bit 2c + h of each qh byte to bit 4.
					f := YMM()
					switch n := 4 - 2*c - h; {
					case n > 0:
						VPSLLW(U8(n), qh, f)
					case n < 0:
						VPSRLW(U8(-n), qh, f)
					default:
						VMOVDQU(qh, f)
					}
					VPAND(c10, f, f)
					VPOR(f, v, v)
				}
				p[h] = YMM()
				VPMADDUBSW(Mem{Base: x, Disp: 64*c + 32*h}, v, p[h])
				if !five {
					continue
				}
				s := YMM()
				VPBROADCASTD(pairAt(r, 2*c+h), s)
				if c == 0 {
					ac[h] = YMM()
					VPMADDWD(s, p[h], ac[h])
				} else {
					VPMADDWD(s, p[h], p[h])
					VPADDD(p[h], ac[h], ac[h])
				}
			}
			if five {
				continue
			}
			l, hw := YMM(), YMM()
			VPUNPCKLWD(p[1], p[0], l)
			VPUNPCKHWD(p[1], p[0], hw)
			VPADDW(hw, l, l)
			s := YMM()
			VPBROADCASTD(wordAt(r, c), s)
			if c < 2 {
				ac[c] = YMM()
				VPMADDWD(s, l, ac[c])
			} else {
				VPMADDWD(s, l, l)
				VPADDD(l, ac[c%2], ac[c%2])
			}
		}
		VPADDD(ac[1], ac[0], ac[0])
		return ac[0]
	}
	// tree4's adds, each pair of rows as soon as it is done (fewer live
	// registers: the Q5_K dot products need most of the 16).
	half := func(r0 int) VecVirtual {
		var a [2]VecVirtual
		for i := range 2 {
			z0 := dot(r0 + 2*i)
			z1 := dot(r0 + 2*i + 1)
			lo, hi := YMM(), YMM()
			VPUNPCKLDQ(z1, z0, lo)
			VPUNPCKHDQ(z1, z0, hi)
			VPADDD(hi, lo, lo)
			a[i] = lo
		}
		lo, hi := YMM(), YMM()
		VPUNPCKLQDQ(a[1], a[0], lo)
		VPUNPCKHQDQ(a[1], a[0], hi)
		VPADDD(hi, lo, lo)
		return lo
	}
	lo := half(0)
	hi := half(4)
	s := joinHalves(lo, hi)
	f := YMM()
	VCVTDQ2PS(s, f)
	VFMADD231PS(sD, f, acc)
	m := YMM()
	VMOVUPS(negM, m)
	VFMADD231PS(sM, m, acc)
	nextSuperBlock(rows, bytes, x, meta, aux, n)
	storeRows8(acc)
}

// k4Tables holds the tables of k4Unpack and row8Q4KAVX2.
type k4Tables struct {
	// idxL, idxH, shr, maskL, mask30: k4Unpack's (per 128-bit half).
	idxL, idxH, shr, maskL, mask30 Mem
	// pairLo and pairHi spread scales 0..3 and 4..7 to (sc, sc) word
	// pairs, scWords widens the scales to words, minWords the mins; dSplit splits 4 d|dmin dwords
	// into d₀..d₃, dmin₀..dmin₃; sign is the f32 sign bit.
	pairLo, pairHi, scWords, minWords, dSplit, sign Mem
}

// k4UnpackTables emits the tables of k4Unpack and row8Q4KAVX2.
func k4UnpackTables() k4Tables {
	const z = 0x80
	dup := func(b []byte) []byte { return append(b, b...) }
	// Byte k of the result (scale k < 8, min k − 8) from the bytes of
	// the scales field (scales[i] at 4 + i of the super-block): L holds
	// the byte of its low bits, H that of its high two bits (scales and
	// mins 4..7 only).
	l := []byte{4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15}
	h := []byte{z, z, z, z, 4, 5, 6, 7, z, z, z, z, 8, 9, 10, 11}
	shr := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}
	var maskL, mask30, pairLo, pairHi, scWords, minWords []byte
	for k := range 16 {
		if k/4%2 == 0 {
			maskL = append(maskL, 0x3f)
		} else {
			maskL = append(maskL, 0x0f)
		}
		mask30 = append(mask30, 0x30)
	}
	for j := range 4 {
		pairLo = append(pairLo, byte(j), z, byte(j), z)
		pairHi = append(pairHi, byte(4+j), z, byte(4+j), z)
	}
	for j := range 8 {
		scWords = append(scWords, byte(j), z)
		minWords = append(minWords, byte(8+j), z)
	}
	var sign []byte
	for range 8 {
		sign = append(sign, 0, 0, 0, 0x80)
	}
	return k4Tables{
		idxL:     table("k4unpackl", dup(l)),
		idxH:     table("k4unpackh", dup(h)),
		shr:      table("k4unpackshr", dup(shr)),
		maskL:    table("k4unpackmask", dup(maskL)),
		mask30:   table("k4unpack30", dup(mask30)),
		pairLo:   table("k4pairlo", dup(pairLo)),
		pairHi:   table("k4pairhi", dup(pairHi)),
		scWords:  table("k4scwords", dup(scWords)),
		minWords: table("k4minwords", dup(minWords)),
		dSplit:   table("k4dsplit", dup([]byte{0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15})),
		sign:     table("f32sign8", sign),
	}
}

// k4Unpack unpacks the 6-bit scales and mins of a Q4_K/Q5_K super-block
// in each 128-bit half of hv (its first 16 bytes: d, dmin, the 12 bytes of
// scales): byte k < 8 of a half of the result is scale k, byte 8 + k min
// k. Scales and mins 0..3 are the low 6 bits of scales[0..3] and [4..7];
// scales 4..7 the low nibbles of scales[8..11] with the top two bits of
// scales[0..3] above, mins 4..7 the high nibbles with those of
// scales[4..7] (ggml's packing; unpackScalesK4 does it in GP registers).
func k4Unpack(u k4Tables, hv VecVirtual) VecVirtual {
	l, h := YMM(), YMM()
	VPSHUFB(u.idxL, hv, l)
	VPSHUFB(u.idxH, hv, h)
	VPSRLVD(u.shr, l, l)
	VPAND(u.maskL, l, l)
	VPSRLW(U8(2), h, h)
	VPAND(u.mask30, h, h)
	VPOR(h, l, l)
	return l
}
