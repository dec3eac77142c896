package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// gemvRowsAVX2 is the number of weight rows the AVX2 single-row (M = 1)
// bf16 and f32 kernels read side by side: gemm reads 4. On the Zen 2 they
// were tuned on (EPYC, family 23 model 49) one core reads 8 streams side
// by side faster than fewer (tensor.ReadScan), and gemm's bf16 widening
// (VPMOVZXWD and VPSLLD per 8 elements) bounded it at ~35 GB/s in L2
// whether it read 4 rows or 8; with 8 rows in the pairs below it does
// 37–42 and cold decode gained 15–25% (docs/performance-log.md). f16 keeps
// gemm's kernel: with 8 rows (VCVTPH2PS per row) it fell from ~37 to ~31
// GB/s in L2.
const gemvRowsAVX2 = 8

// gemvAVX2 emits gemmAVX2BF16R1 or gemmAVX2F32R1, the AVX2 kernel for one
// row of x (M = 1, single-stream decode) over n rows of bf16 or f32 weights. It has gemm's
// signature and each output's reduction order: one 8-lane chain per
// weight row marching over K in steps of 8 (lane l takes elements
// 8s + l, in order of s), the tree (l+l⁴)(l+l²)(l+l¹), then the K%8 tail
// with scalar FMAs in order, so its results are gemm's bit for bit. It
// differs in how many rows it reads at once: gemvRowsAVX2 per pass, then
// 4 (gemm's pass), then one at a time.
//
// For bf16 the eight rows are taken as four pairs: 8 elements (one step)
// of row a in the low half of a register and the same 8 of row b in the
// high half. Interleaving the 16-bit words with zeros (VPUNPCKLWD and
// VPUNPCKHWD, which work within each half) widens them to f32 as
// [a₀…a₃ | b₀…b₃] and [a₄…a₇ | b₄…b₇]: two unpacks per 16 elements where
// VPMOVZXWD and VPSLLD took four operations, and each lane of a row's
// chain stays in one lane of one of the pair's two accumulators, taking
// the same FMAs in the same order as in gemm (x is broadcast as
// [x₀…x₃ | x₀…x₃] and [x₄…x₇ | x₄…x₇]). After the loop a 128-bit permute
// of the two accumulators rebuilds each row's 8-lane one exactly. f32
// rows need no widening: one FMA from memory per row and step.
func gemvAVX2(dt dtype) {
	s := avx2
	name := fmt.Sprintf("gemm%s%sR1", s.name, dt.name)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(x *float32, ldx int, w %s, ldw int, k int, n int, out *float32, ldo int, pf uintptr)", dt.goType))
	Doc(fmt.Sprintf("%s computes 1 rows of x times n rows of %s weights (see asmgen).", name, dt.name))

	// A call's n rows are split into the 8 streams of gemvRowsAVX2: with
	// q = n/8, stream c is rows c·q … c·q+q-1, and pass j reads row j of
	// every stream, so each stream runs through q·ldw contiguous elements
	// (the Zen 2 reads 8 long streams side by side near its read limit;
	// 8 adjacent short rows, 1,152 bytes each in SmolLM2, read at half
	// that). Rows 8q … n-1 follow with gemm's 4-row and single passes.
	// The cursors, strides and passes left live on the stack during the
	// wide passes, whose loop needs the registers.
	wcurM, ocurM, passM := AllocLocal(8), AllocLocal(8), AllocLocal(8)
	wstrM, ostrM, wendM, oendM := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	{
		w := Load(Param("w"), GP64())
		o := Load(Param("out"), GP64())
		MOVQ(w, wcurM)
		MOVQ(o, ocurM)
		q := Load(Param("n"), GP64())
		SHRQ(U8(3), q)
		MOVQ(q, passM)
		wstr := Load(Param("ldw"), GP64())
		IMULQ(q, wstr)
		SHLQ(U8(dt.shift), wstr)
		MOVQ(wstr, wstrM)
		SHLQ(U8(2), q)
		MOVQ(q, ostrM)
		// The rows after the wide passes start 8 strides in.
		SHLQ(U8(3), wstr)
		ADDQ(wstr, w)
		MOVQ(w, wendM)
		SHLQ(U8(3), q)
		ADDQ(q, o)
		MOVQ(o, oendM)
	}
	pfcur = nil

	Label("wide")
	CMPQ(passM, U8(0))
	JE(LabelRef("group"))
	gemvWidePass(dt, wcurM, ocurM, wstrM, ostrM)
	DECQ(passM)
	JMP(LabelRef("wide"))

	Label("group")
	k := Load(Param("k"), GP64())
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-s.lanes), kv)
	xr := []GPVirtual{Load(Param("x"), GP64()).(GPVirtual)}
	wcur, ocur, nrem := GP64(), GP64(), GP64()
	MOVQ(wendM, wcur)
	MOVQ(oendM, ocur)
	Load(Param("n"), nrem)
	ANDQ(U8(gemvRowsAVX2-1), nrem)
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	gemmPass(s, dt, 1, 4, xr, wcur, ocur, k, kv, nil, "g")
	SUBQ(U32(4), nrem)

	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	gemmPass(s, dt, 1, 1, xr, wcur, ocur, k, kv, nil, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))

	Label("done")
	VZEROUPPER()
	RET()
}

// gemvWidePass emits one pass of gemvAVX2BF16 over gemvRowsAVX2 weight rows,
// one per stream (wstrM bytes apart, their outputs ostrM bytes apart), and
// the whole K, and advances wcur and ocur (kept on the stack, at wcurM and
// ocurM) by one row and one output.
func gemvWidePass(dt dtype, wcurM, ocurM, wstrM, ostrM Mem) {
	const cols = gemvRowsAVX2
	x := Load(Param("x"), GP64()).(GPVirtual)
	kv := Load(Param("k"), GP64())
	ANDQ(I32(-8), kv)
	wstr := GP64()
	MOVQ(wstrM, wstr)
	wr := make([]GPVirtual, cols)
	for c := range wr {
		wr[c] = GP64()
		if c == 0 {
			MOVQ(wcurM, wr[c])
		} else {
			LEAQ(Mem{Base: wr[c-1], Index: wstr, Scale: 1}, wr[c])
		}
	}
	ldw := Load(Param("ldw"), GP64())
	SHLQ(U8(dt.shift), ldw)
	ADDQ(ldw, wcurM)

	acc := make([]VecVirtual, cols)
	for c := range acc {
		acc[c] = YMM()
		VXORPS(acc[c], acc[c], acc[c])
	}
	var zero VecVirtual
	if dt == dtBF16 {
		zero = YMM()
		VPXOR(zero, zero, zero)
	}

	idx = GP64()
	XORQ(idx, idx)
	TESTQ(kv, kv)
	JE(LabelRef("wtail"))
	Label("wloop")
	wm := func(c int) Mem { return Mem{Base: wr[c], Index: idx, Scale: 1 << dt.shift} }
	xm := Mem{Base: x, Index: idx, Scale: 4}
	if dt == dtF32 {
		xv := YMM()
		VMOVUPS(xm, xv)
		for c := range cols {
			VFMADD231PS(wm(c), xv, acc[c])
		}
	} else {
		// acc[2p] holds lanes 0–3 of rows 2p (low half) and 2p+1 (high
		// half), acc[2p+1] their lanes 4–7.
		xlo, xhi := YMM(), YMM()
		VBROADCASTF128(xm, xlo)
		VBROADCASTF128(xm.Offset(16), xhi)
		for p := range cols / 2 {
			v := YMM()
			VMOVDQU(wm(2*p), v.AsX())
			VINSERTI128(U8(1), wm(2*p+1), v, v)
			e := YMM()
			VPUNPCKLWD(v, zero, e) // a₀…a₃ | b₀…b₃ (each word << 16)
			VPUNPCKHWD(v, zero, v) // a₄…a₇ | b₄…b₇
			VFMADD231PS(xlo, e, acc[2*p])
			VFMADD231PS(xhi, v, acc[2*p+1])
		}
	}
	ADDQ(U32(8), idx)
	CMPQ(idx, kv)
	JL(LabelRef("wloop"))
	Label("wtail")

	sums := make([]VecVirtual, cols)
	for p := range cols / 2 {
		lo, hi := acc[2*p], acc[2*p+1]
		if dt == dtF32 {
			sums[2*p] = reduce(avx2, lo)
			sums[2*p+1] = reduce(avx2, hi)
			continue
		}
		// a₀…a₃ | b₀…b₃, a₄…a₇ | b₄…b₇
		ra, rb := YMM(), YMM()
		VPERM2F128(U8(0x20), hi, lo, ra)
		VPERM2F128(U8(0x31), hi, lo, rb)
		sums[2*p] = reduce(avx2, ra)
		sums[2*p+1] = reduce(avx2, rb)
	}
	k := Load(Param("k"), GP64())
	Label("wscalar")
	CMPQ(idx, k)
	JE(LabelRef("wstore"))
	xv := XMM()
	VMOVSS(Mem{Base: x, Index: idx, Scale: 4}, xv)
	for c := range cols {
		wv := XMM()
		loadScalarW(dt, Mem{Base: wr[c], Index: idx, Scale: 1 << dt.shift}, wv)
		VFMADD231SS(wv, xv, sums[c])
	}
	INCQ(idx)
	JMP(LabelRef("wscalar"))
	Label("wstore")
	ocur, ostr := GP64(), GP64()
	MOVQ(ocurM, ocur)
	MOVQ(ostrM, ostr)
	for c := range cols {
		VMOVSS(sums[c], Mem{Base: ocur})
		if c+1 < cols {
			ADDQ(ostr, ocur)
		}
	}
	ADDQ(U8(4), ocurM)
}
