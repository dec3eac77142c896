package main

// The AVX2 8-stream row kernels of the 32-blocks (row8AVX2: Q8_0, Q4_0,
// Q5_0) and of Q6_K (row8Q6KAVX2), and what the 8-stream kernels share:
// the 8 rows' scales times the activation's into the accumulator
// (fmaScales), the halves' join, the step to the next super-block and the
// store of the 8 sums. The Q4_K/Q5_K one is in row8q4k.go; why 8 streams,
// and how the driver lays them out, is in rowstreams.go.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

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
// (docs/performance-log.md).
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
