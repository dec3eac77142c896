package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// gemmKB emits gemmAVX2<dt>R<rows>KB, gemm's AVX2 multi-row kernel over one
// block [k0,k1) of K, for products whose rows are too long for the x rows
// of a tile and its weight rows to share L1 (f32 x rows of K = 1,536 take
// 24 KiB for 4 rows). Its 8-lane accumulators start at zero when k0 = 0 and
// from acc otherwise; after the block they go back to acc, or, when k1 is
// k&^7 (the last block), through gemm's tree and K%8 scalar tail to out.
// Each output's accumulator takes the same FMAs in the same order as in
// gemm, and a vector stored and reloaded is exact, so the results are
// gemm's bit for bit whatever the blocks.
//
// acc holds 8 floats per output: those of weight row j and x row r at
// acc[(j·rows + r)·8:]. k0 < k1 are multiples of 8 and k1 ≤ k&^7.
func gemmKB(dt dtype, rows int) {
	s := avx2
	name := fmt.Sprintf("gemm%s%sR%dKB", s.name, dt.name, rows)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(x *float32, ldx int, w %s, ldw int, k0 int, k1 int, k int, n int, out *float32, ldo int, acc *float32)", dt.goType))
	Doc(fmt.Sprintf("%s is gemmAVX2%sR%d over elements [k0,k1) of K, its accumulators kept in acc between blocks (see asmgen).", name, dt.name, rows))

	xr := xRows(rows, 2)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	acur := Load(Param("acc"), GP64())
	nrem := Load(Param("n"), GP64())

	cols := s.cols(rows)
	pass := func(c int, p string) { gemmKBPass(dt, rows, c, xr, wcur, ocur, acur, p) }
	Label("group")
	CMPQ(nrem, U32(cols))
	JL(LabelRef("pair"))
	pass(cols, "g")
	SUBQ(U32(cols), nrem)
	JMP(LabelRef("group"))
	Label("pair")
	if cols > 2 {
		CMPQ(nrem, U32(2))
		JL(LabelRef("single"))
		pass(2, "p")
		SUBQ(U32(2), nrem)
	}
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	pass(1, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// gemmKBPass emits one rows×cols tile over [k0,k1) and advances wcur by
// cols weight rows, ocur by cols outputs and acur by their accumulators.
func gemmKBPass(dt dtype, rows, cols int, xr []GPVirtual, wcur, ocur, acur Register, p string) {
	s := avx2
	wr := weightRows(wcur, dt.shift, cols)

	// Output (c, r) keeps its accumulator at acur + (c·rows + r)·32.
	accAt := func(r, c int) Mem { return Mem{Base: acur, Disp: 32 * (c*rows + r)} }
	acc := make([][]VecVirtual, rows)
	for r := range acc {
		acc[r] = make([]VecVirtual, cols)
		for c := range acc[r] {
			acc[r][c] = s.vec()
		}
	}
	idx = Load(Param("k0"), GP64()).(GPVirtual)
	TESTQ(idx, idx)
	JNE(LabelRef(p + "resume"))
	for r := range rows {
		for c := range cols {
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	JMP(LabelRef(p + "loop"))
	Label(p + "resume")
	for r := range rows {
		for c := range cols {
			VMOVUPS(accAt(r, c), acc[r][c])
		}
	}
	Label(p + "loop")
	ws := make([]VecVirtual, cols)
	for c := range ws {
		ws[c] = s.vec()
		loadW(s, dt, Mem{Base: wr[c], Index: idx, Scale: 1 << dt.shift}, ws[c], nil)
	}
	for r := range rows {
		xv := s.vec()
		VMOVUPS(Mem{Base: xr[r], Index: idx, Scale: 4}, xv)
		for c := range cols {
			VFMADD231PS(ws[c], xv, acc[r][c])
		}
	}
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, paramMem("k1"))
	JL(LabelRef(p + "loop"))

	// Not the last block: keep the accumulators for the next one.
	kv := Load(Param("k"), GP64())
	ANDQ(I32(-s.lanes), kv)
	CMPQ(idx, kv)
	JE(LabelRef(p + "last"))
	for r := range rows {
		for c := range cols {
			VMOVUPS(acc[r][c], accAt(r, c))
		}
	}
	JMP(LabelRef(p + "next"))

	// The last block: gemm's tree, scalar tail and stores.
	Label(p + "last")
	sums := reduceScalarTail(dt, acc, xr, wr, paramMem("k"), p)
	orow := GP64()
	MOVQ(ocur, orow)
	ldo := Load(Param("ldo"), GP64())
	SHLQ(U8(2), ldo)
	for r := range rows {
		for c := range cols {
			VMOVSS(sums[r][c], Mem{Base: orow, Disp: 4 * c})
		}
		if r+1 < rows {
			ADDQ(ldo, orow)
		}
	}
	Label(p + "next")
	ADDQ(U32(4*cols), ocur)
	ADDQ(U32(32*rows*cols), acur)
}
