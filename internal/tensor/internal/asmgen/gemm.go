package main

// The f32/bf16/f16 matrix-product kernels gemm<ISA><dtype>R2..4 (and AVX2's
// f16 R1): the rows×cols register tiles over the whole K (gemmPass, with the
// multi-row kernels' prefetch cursor pfcur), the AVX-512 reduction of four
// columns at a time that stores them (reduceQuads512), and what the other
// tiles share with them: the x and weight row addresses (xRows, weightRows)
// and AVX2's tree and scalar K tail (reduceScalarTail). The AVX-512 one-row
// kernel is in gemmwide.go; AVX2's one-row and K-blocked kernels in
// gemvavx2.go and gemmkb.go; the bf16-by-bf16 ones in dpbf16.go.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// gemm emits a kernel computing out[r*ldo+j] = Σ_t x[r*ldx+t]·w[j*ldw+t] for
// r < rows, j < n, t < k, processing cols weight rows per pass and the
// remaining n%cols rows one at a time. ldx, ldw and ldo count elements.
func gemm(s isa, dt dtype, rows int) {
	name := fmt.Sprintf("gemm%s%sR%d", s.name, dt.name, rows)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(x *float32, ldx int, w %s, ldw int, k int, n int, out *float32, ldo int, pf uintptr)", dt.goType))
	Doc(fmt.Sprintf("%s computes %d rows of x times n rows of %s weights (see asmgen).", name, rows, dt.name))

	k := Load(Param("k"), GP64())
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-s.lanes), kv)
	var mask Op
	if s.lanes == 16 {
		mask = tailMask(k)
	}

	xr := xRows(rows, 2)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())
	pfcur = nil
	if rows > 1 {
		pfcur = Load(Param("pf"), GP64()).(GPVirtual)
	}

	cols := s.cols(rows)
	Label("group")
	CMPQ(nrem, U32(cols))
	JL(LabelRef("single"))
	gemmPass(s, dt, rows, cols, xr, wcur, ocur, k, kv, mask, "g")
	SUBQ(U32(cols), nrem)
	JMP(LabelRef("group"))

	if s.lanes == 8 && cols == 3 {
		// Two rows left: one 2-column pass (the former 4×2 tile) rather
		// than two single ones.
		CMPQ(nrem, U32(2))
		JL(LabelRef("single"))
		gemmPass(s, dt, rows, 2, xr, wcur, ocur, k, kv, mask, "p")
		SUBQ(U32(2), nrem)
	}
	Label("single")
	if cols > 1 {
		TESTQ(nrem, nrem)
		JE(LabelRef("done"))
		gemmPass(s, dt, rows, 1, xr, wcur, ocur, k, kv, mask, "s")
		DECQ(nrem)
		JMP(LabelRef("single"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// gemmPass emits one rows×cols register tile over the whole K and advances
// wcur by cols weight rows and ocur by cols outputs.
func gemmPass(s isa, dt dtype, rows, cols int, xr []GPVirtual, wcur, ocur, k, kv Register, mask Op, p string) {
	wr := weightRows(wcur, dt.shift, cols)

	acc := make([][]VecVirtual, rows)
	for r := range acc {
		acc[r] = make([]VecVirtual, cols)
		for c := range acc[r] {
			acc[r][c] = s.vec()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	step := func(m Op) {
		ws := make([]VecVirtual, cols)
		for c := range ws {
			ws[c] = s.vec()
			loadW(s, dt, Mem{Base: wr[c], Index: i(), Scale: 1 << dt.shift}, ws[c], m)
		}
		for r := range rows {
			xv := s.vec()
			if m == nil {
				VMOVUPS(Mem{Base: xr[r], Index: i(), Scale: 4}, xv)
			} else {
				VMOVUPS_Z(Mem{Base: xr[r], Index: i(), Scale: 4}, m, xv)
			}
			for c := range cols {
				VFMADD231PS(ws[c], xv, acc[r][c])
			}
		}
	}
	idx = GP64()
	XORQ(idx, idx)
	TESTQ(kv, kv)
	JE(LabelRef(p + "tail"))
	Label(p + "loop")
	if pfcur != nil {
		// One line of the region the driver wants warm (the next panel
		// of weights) per K step, so DRAM streaming overlaps the FMAs:
		// into the L2 with AVX-512 (see dpbf16.go's dpPass), into the L1
		// with AVX2 (tuned on a Zen 2).
		if s.lanes == 16 {
			PREFETCHT1(Mem{Base: pfcur})
		} else {
			PREFETCHT0(Mem{Base: pfcur})
		}
		ADDQ(U32(64), pfcur)
	}
	step(nil)
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, kv)
	JL(LabelRef(p + "loop"))
	Label(p + "tail")

	sums := make([][]VecVirtual, rows)
	if s.lanes == 16 {
		CMPQ(idx, k)
		JE(LabelRef(p + "reduce"))
		step(mask)
		Label(p + "reduce")
		if cols == 4 {
			reduceQuads512(acc, ocur)
			ADDQ(U32(4*cols), ocur)
			return
		}
		for r := range rows {
			sums[r] = make([]VecVirtual, cols)
			for c := range cols {
				sums[r][c] = reduce(s, acc[r][c])
			}
		}
	} else {
		sums = reduceScalarTail(dt, acc, xr, wr, k, p)
	}

	outRows(ocur, rows, func(r int, orow GPVirtual) {
		for c := range cols {
			VMOVSS(sums[r][c], Mem{Base: orow, Disp: 4 * c})
		}
	})
	ADDQ(U32(4*cols), ocur)
}

// outRows emits store(r, orow) for each output row r < rows, orow holding
// the row's address: ocur, then ldo f32 elements further per row.
func outRows(ocur Register, rows int, store func(r int, orow GPVirtual)) {
	orow := GP64()
	MOVQ(ocur, orow)
	var ldo Register
	if rows > 1 {
		ldo = Load(Param("ldo"), GP64())
		SHLQ(U8(2), ldo)
	}
	for r := range rows {
		store(r, orow)
		if r+1 < rows {
			ADDQ(ldo, orow)
		}
	}
}

// strided8 sets up the addresses of wideCols places stride bytes apart
// from base with three registers instead of eight: place c is at
// bases[c/3] + (c%3)·stride. It returns the bases (to advance them) and
// the address of place c at byte displacement disp.
func strided8(base, stride Register) ([]GPVirtual, func(c, disp int) Mem) {
	p0, p3, p6 := GP64(), GP64(), GP64()
	MOVQ(base, p0)
	LEAQ(Mem{Base: p0, Index: stride, Scale: 2}, p3)
	ADDQ(stride, p3)
	LEAQ(Mem{Base: p3, Index: stride, Scale: 2}, p6)
	ADDQ(stride, p6)
	bases := []GPVirtual{p0, p3, p6}
	return bases, func(c, disp int) Mem {
		m := Mem{Base: bases[c/3], Disp: disp}
		if c%3 != 0 {
			m.Index, m.Scale = stride, uint8(c%3)
		}
		return m
	}
}

// xRows loads the addresses of a kernel's rows x rows, ldx elements of
// 1<<shift bytes apart.
func xRows(rows int, shift uint8) []GPVirtual {
	xr := make([]GPVirtual, rows)
	xr[0] = Load(Param("x"), GP64()).(GPVirtual)
	if rows > 1 {
		ldx := Load(Param("ldx"), GP64())
		SHLQ(U8(shift), ldx)
		for r := 1; r < rows; r++ {
			xr[r] = GP64()
			LEAQ(Mem{Base: xr[r-1], Index: ldx, Scale: 1}, xr[r])
		}
	}
	return xr
}

// weightRows returns the addresses of cols weight rows from wcur, ldw
// elements of 1<<shift bytes apart, and advances wcur past them.
func weightRows(wcur Register, shift uint8, cols int) []GPVirtual {
	ldw := Load(Param("ldw"), GP64())
	SHLQ(U8(shift), ldw)
	wr := make([]GPVirtual, cols)
	for c := range wr {
		wr[c] = GP64()
		if c == 0 {
			MOVQ(wcur, wr[c])
		} else {
			LEAQ(Mem{Base: wr[c-1], Index: ldw, Scale: 1}, wr[c])
		}
	}
	LEAQ(Mem{Base: wr[cols-1], Index: ldw, Scale: 1}, wcur)
	return wr
}

// reduceScalarTail ends an AVX2 tile (labels prefixed p): it reduces each
// accumulator acc[r][c] with the fixed tree, then adds the K%8 tail from
// element idx up to k one element at a time with scalar FMAs, in order
// (x row r at xr[r], weight row c at wr[c]), and returns the sums, which
// label p+"store" follows.
func reduceScalarTail(dt dtype, acc [][]VecVirtual, xr, wr []GPVirtual, k Op, p string) [][]VecVirtual {
	rows, cols := len(acc), len(wr)
	sums := make([][]VecVirtual, rows)
	for r := range rows {
		sums[r] = make([]VecVirtual, cols)
		for c := range cols {
			sums[r][c] = reduce(avx2, acc[r][c])
		}
	}
	Label(p + "scalar")
	CMPQ(idx, k)
	JE(LabelRef(p + "store"))
	ws := make([]VecVirtual, cols)
	for c := range ws {
		ws[c] = XMM()
		loadScalarW(dt, Mem{Base: wr[c], Index: idx, Scale: 1 << dt.shift}, ws[c])
	}
	for r := range rows {
		xv := XMM()
		VMOVSS(Mem{Base: xr[r], Index: idx, Scale: 4}, xv)
		for c := range cols {
			VFMADD231SS(ws[c], xv, sums[r][c])
		}
	}
	INCQ(idx)
	JMP(LabelRef(p + "scalar"))
	Label(p + "store")
	return sums
}

// pfcur, when set, is the register of the multi-row kernels' prefetch
// cursor (parameter pf): every full K step prefetches the line at pfcur
// and advances it by 64 bytes.
var pfcur GPVirtual

// reduceQuads512 reduces the rows×4 accumulators of an AVX-512 pass with the
// same tree as reduce — lane l plus lane l+8, then l+4, l+2, l+1 — but
// several accumulators per instruction, and stores row r's four sums to
// out+r·ldo. Float addition is commutative, so pairing the same lanes in
// the same tree gives bit-identical sums.
func reduceQuads512(acc [][]VecVirtual, ocur Register) { reduceQuads512At(acc, ocur, 0) }

// reduceQuads512At is reduceQuads512 storing at out+disp bytes.
func reduceQuads512At(acc [][]VecVirtual, ocur Register, disp int) {
	sums := quadSums512(acc)
	outRows(ocur, len(acc), func(r int, orow GPVirtual) { VMOVUPS(sums[r], Mem{Base: orow, Disp: disp}) })
}

// quadSums512 reduces the rows×4 accumulators of an AVX-512 pass by
// reduceQuads512's tree and returns, for row r, an XMM register holding
// its four sums in order.
func quadSums512(acc [][]VecVirtual) []Register {
	rows := len(acc)
	shuf := func(imm uint8, a, b VecVirtual) VecVirtual { // 128-bit lanes a[i0] a[i1] b[i2] b[i3]
		t := ZMM()
		VSHUFF32X4(U8(imm), b, a, t)
		return t
	}
	shufps := func(imm uint8, a, b VecVirtual) VecVirtual { // per 128-bit lane
		t := ZMM()
		VSHUFPS(U8(imm), b, a, t)
		return t
	}
	add := func(a, b VecVirtual) VecVirtual {
		VADDPS(b, a, a)
		return a
	}
	// Levels 1 and 2 per row: q's 128-bit lane c holds accumulator (r,c)
	// reduced to 4 lanes.
	q := make([]VecVirtual, 4)
	for r := range rows {
		m := acc[r]
		s01 := add(shuf(0x44, m[0], m[1]), shuf(0xEE, m[0], m[1]))
		s23 := add(shuf(0x44, m[2], m[3]), shuf(0xEE, m[2], m[3]))
		q[r] = add(shuf(0x88, s01, s23), shuf(0xDD, s01, s23))
	}
	for r := rows; r < 4; r++ {
		q[r] = q[0] // padding: computed and never stored
	}
	// Levels 3 and 4 across rows: element r of 128-bit lane c is (r,c).
	r01 := add(shufps(0x44, q[0], q[1]), shufps(0xEE, q[0], q[1]))
	r23 := r01
	if rows > 2 {
		r23 = add(shufps(0x44, q[2], q[3]), shufps(0xEE, q[2], q[3]))
	}
	f := add(shufps(0x88, r01, r23), shufps(0xDD, r01, r23))
	sums := make([]Register, rows)
	for r := range rows {
		g := GP32()
		MOVL(U32(0x1111<<r), g)
		km := K()
		KMOVW(g, km)
		t := ZMM()
		VCOMPRESSPS_Z(f, km, t)
		sums[r] = t.AsX()
	}
	return sums
}
