// Command asmgen generates the amd64 assembly kernels of package tensor with
// avo. Run it through `go generate` in internal/tensor; the output
// (kern_amd64.s and kern_amd64_stubs.go) is committed, so building Tandem does
// not need avo.
//
// Every dot product computed by a kernel of one instruction set has the same
// accumulation structure, whichever kernel computes it:
//
//   - AVX-512: one 16-lane accumulator marches over K in steps of 16; the last
//     partial step loads zeros in the masked-off lanes; the 16 lanes are then
//     reduced by the fixed tree (l+l⁸)(l+l⁴)(l+l²)(l+l¹).
//   - AVX2: one 8-lane accumulator marches over K in steps of 8, is reduced by
//     the tree (l+l⁴)(l+l²)(l+l¹), and the K%8 tail is added one element at a
//     time with scalar FMAs, in order.
//
// This is what makes the matrix product batch invariant: an output element
// does not depend on the tile shape, the edge handling or M.
package main

import (
	"flag"
	"fmt"
	"os"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// dtype describes how a weight element is stored and widened to f32.
type dtype struct {
	name   string // suffix in kernel names
	goType string // pointer type in the Go stub
	shift  uint8  // log2 of the element size in bytes
}

var (
	dtF32  = dtype{"F32", "*float32", 2}
	dtBF16 = dtype{"BF16", "*uint16", 1}
	dtF16  = dtype{"F16", "*uint16", 1}
)

// isa describes one vector instruction set.
type isa struct {
	name  string
	lanes int
	vec   func() VecVirtual
	// cols is the number of weight rows a kernel with r x-rows processes
	// per pass (its register tile is r×cols accumulators).
	cols func(r int) int
}

var (
	avx512 = isa{name: "AVX512", lanes: 16, vec: ZMM, cols: func(r int) int { return 4 }}
	// AVX2's 16 vector registers hold a 4×3 tile (12 accumulators, the
	// 3 weight vectors and one activation vector): with the FMA's latency
	// of 5 cycles and two FMA pipes, 10 or more independent chains keep
	// both busy, where the 4×2 tile's 8 could not.
	avx2 = isa{name: "AVX2", lanes: 8, vec: YMM, cols: func(r int) int {
		if r <= 2 {
			return 4
		}
		return 3
	}}
)

func main() {
	ConstraintExpr("amd64")
	constants()
	prefetchRows()
	for _, s := range []isa{avx512, avx2} {
		for _, dt := range []dtype{dtF32, dtBF16, dtF16} {
			for r := 1; r <= 4; r++ {
				if r == 1 && s.lanes == 16 {
					gemmWideR1(s, dt)
					continue
				}
				if r == 1 && s.lanes == 8 && dt != dtF16 {
					gemvAVX2(dt)
					continue
				}
				gemm(s, dt, r)
			}
		}
		if s.lanes == 8 {
			for _, dt := range []dtype{dtF32, dtBF16, dtF16} {
				for r := 3; r <= 4; r++ {
					gemmKB(dt, r)
				}
			}
		}
		dot(s)
		axpy(s)
		if s.lanes == 16 {
			axpyRows512(dtF32)
			axpyRows512(dtBF16)
		}
		siluMul(s)
		expSum(s)
		if s.lanes == 8 {
			quantKernelsAVX2()
			qact8_0AVX2()
			qact8KAVX2()
			rowKernels(false)
			for g := 1; g <= 4; g++ {
				axpyRowsAVX2(dtBF16, g)
			}
			for g := 1; g <= 4; g++ {
				axpyRowsAVX2(dtF32, g)
			}
			argMaxAVX2(iotaTable())
			for _, st := range readScanStreams {
				readScanAVX2(st)
			}
			for r := 1; r <= 3; r++ {
				attnScoresAVX2(r)
			}
			for r := 1; r <= 3; r++ {
				attnKeysAVX2(r)
			}
		}
		if s.lanes == 16 {
			gemmDPR1()
			for r := 2; r <= 4; r++ {
				gemmDP(r)
			}
			cvtBF16()
			cvtBF16Stream()
			iota := iotaTable()
			argMax512(iota)
			appendAbove512(iota)
			for g := 2; g <= 4; g++ {
				axpyRowsGroup(g)
			}
			for r := 1; r <= 4; r++ {
				attnScores(r)
			}
			attnSoftmax()
			attnPV(pvIndex())
			quantKernels()
			rowKernels(true)
		}
	}
	Generate()
	out := flag.Lookup("out").Value.String()
	if err := rawEncode(out); err != nil {
		fmt.Fprintln(os.Stderr, "asmgen:", err)
		os.Exit(1)
	}
	if err := checkVEXOnly(out); err != nil {
		fmt.Fprintln(os.Stderr, "asmgen:", err)
		os.Exit(1)
	}
}

// tailMask loads into a mask register the lanes of the last partial step of
// a length-k loop: bit t is set for t < k%16.
func tailMask(k Register) OpmaskVirtual {
	t := GP32()
	MOVL(k.(GPVirtual).As32(), t)
	ANDL(U32(15), t)
	ones := GP32()
	MOVL(U32(0xffff), ones)
	m := GP32()
	BZHIL(t, ones, m)
	km := K()
	KMOVW(m, km)
	return km
}

// loadW loads one vector of weights at m, widened to f32, into dst. With a
// mask the lanes beyond the mask are zero and the memory beyond them is not
// touched.
func loadW(s isa, dt dtype, m Mem, dst VecVirtual, mask Op) {
	if mask == nil {
		switch dt {
		case dtF32:
			VMOVUPS(m, dst)
		case dtBF16:
			VPMOVZXWD(m, dst)
			VPSLLD(U8(16), dst, dst)
		case dtF16:
			VCVTPH2PS(m, dst)
		}
		return
	}
	switch dt {
	case dtF32:
		VMOVUPS_Z(m, mask, dst)
	case dtBF16:
		h := YMM()
		VMOVDQU16_Z(m, mask, h)
		VPMOVZXWD(h, dst)
		VPSLLD(U8(16), dst, dst)
	case dtF16:
		h := YMM()
		VMOVDQU16_Z(m, mask, h)
		VCVTPH2PS(h, dst)
	}
}

// loadScalarW loads one weight element at m, widened to f32, into the low
// lane of dst.
func loadScalarW(dt dtype, m Mem, dst VecVirtual) {
	switch dt {
	case dtF32:
		VMOVSS(m, dst)
	case dtBF16:
		t := GP32()
		MOVWLZX(m, t)
		SHLL(U8(16), t)
		VMOVD(t, dst)
	case dtF16:
		t := GP32()
		MOVWLZX(m, t)
		VMOVD(t, dst)
		VCVTPH2PS(dst, dst)
	}
}

// reduce sums the lanes of acc with the instruction set's fixed tree and
// returns an XMM register holding the sum in its low lane.
func reduce(s isa, acc VecVirtual) VecVirtual {
	x := XMM()
	if s.lanes == 16 {
		y := YMM()
		VEXTRACTF32X8(U8(1), acc, y)
		VADDPS(y, acc.AsY(), y)
		VEXTRACTF32X4(U8(1), y, x)
		VADDPS(x, y.AsX(), x)
	} else {
		VEXTRACTF128(U8(1), acc, x)
		VADDPS(x, acc.AsX(), x)
	}
	x2 := XMM()
	VMOVHLPS(x, x, x2)
	VADDPS(x2, x, x2)
	x3 := XMM()
	VMOVSHDUP(x2, x3)
	VADDSS(x3, x2, x3)
	return x3
}

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

	xr := make([]GPVirtual, rows)
	xr[0] = Load(Param("x"), GP64()).(GPVirtual)
	if rows > 1 {
		ldx := Load(Param("ldx"), GP64())
		SHLQ(U8(2), ldx)
		for r := 1; r < rows; r++ {
			xr[r] = GP64()
			LEAQ(Mem{Base: xr[r-1], Index: ldx, Scale: 1}, xr[r])
		}
	}
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
	ldw := Load(Param("ldw"), GP64())
	SHLQ(U8(dt.shift), ldw)
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
		// of weights) per K step, so DRAM streaming overlaps the FMAs.
		PREFETCHT0(Mem{Base: pfcur})
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
		for r := range rows {
			sums[r] = make([]VecVirtual, cols)
			for c := range cols {
				sums[r][c] = reduce(s, acc[r][c])
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
	}

	orow := GP64()
	MOVQ(ocur, orow)
	var ldo Register
	if rows > 1 {
		ldo = Load(Param("ldo"), GP64())
		SHLQ(U8(2), ldo)
	}
	for r := range rows {
		for c := range cols {
			VMOVSS(sums[r][c], Mem{Base: orow, Disp: 4 * c})
		}
		if r+1 < rows {
			ADDQ(ldo, orow)
		}
	}
	ADDQ(U32(4*cols), ocur)
}

// idx is the element index register of the K loop being emitted.
var idx GPVirtual

// pfcur, when set, is the register of the multi-row kernels' prefetch
// cursor (parameter pf): every full K step prefetches the line at pfcur
// and advances it by 64 bytes.
var pfcur GPVirtual

func i() Register { return idx }

// dot emits Dot over n elements with the instruction set's fixed structure.
func dot(s isa) {
	name := "dot" + s.name
	TEXT(name, NOSPLIT, "func(a, b *float32, n int) float32")
	Doc(name + " returns Σ a[t]·b[t] for t < n.")
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	n := Load(Param("n"), GP64())
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-s.lanes), nv)
	acc := s.vec()
	VXORPS(acc, acc, acc)
	idx = GP64()
	XORQ(idx, idx)
	TESTQ(nv, nv)
	JE(LabelRef("tail"))
	Label("loop")
	v := s.vec()
	VMOVUPS(Mem{Base: a, Index: idx, Scale: 4}, v)
	VFMADD231PS(Mem{Base: b, Index: idx, Scale: 4}, v, acc)
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, nv)
	JL(LabelRef("loop"))
	Label("tail")
	if s.lanes == 16 {
		mask := tailMask(n)
		CMPQ(idx, n)
		JE(LabelRef("reduce"))
		va, vb := s.vec(), s.vec()
		VMOVUPS_Z(Mem{Base: a, Index: idx, Scale: 4}, mask, va)
		VMOVUPS_Z(Mem{Base: b, Index: idx, Scale: 4}, mask, vb)
		VFMADD231PS(vb, va, acc)
		Label("reduce")
		sum := reduce(s, acc)
		Store(sum, ReturnIndex(0))
	} else {
		sum := reduce(s, acc)
		Label("scalar")
		CMPQ(idx, n)
		JE(LabelRef("done"))
		xa := XMM()
		VMOVSS(Mem{Base: a, Index: idx, Scale: 4}, xa)
		VFMADD231SS(Mem{Base: b, Index: idx, Scale: 4}, xa, sum)
		INCQ(idx)
		JMP(LabelRef("scalar"))
		Label("done")
		Store(sum, ReturnIndex(0))
	}
	VZEROUPPER()
	RET()
}

// axpy emits y[t] += alpha·x[t] for t < n, one FMA per element.
func axpy(s isa) {
	name := "axpy" + s.name
	TEXT(name, NOSPLIT, "func(alpha float32, x, y *float32, n int)")
	Doc(name + " computes y[t] = fma(alpha, x[t], y[t]) for t < n.")
	al := s.vec()
	VBROADCASTSS(NewParamAddr("alpha", 0), al)
	x := Load(Param("x"), GP64())
	y := Load(Param("y"), GP64())
	n := Load(Param("n"), GP64())
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-s.lanes), nv)
	idx = GP64()
	XORQ(idx, idx)
	TESTQ(nv, nv)
	JE(LabelRef("tail"))
	Label("loop")
	v := s.vec()
	VMOVUPS(Mem{Base: y, Index: idx, Scale: 4}, v)
	VFMADD231PS(Mem{Base: x, Index: idx, Scale: 4}, al, v)
	VMOVUPS(v, Mem{Base: y, Index: idx, Scale: 4})
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, nv)
	JL(LabelRef("loop"))
	Label("tail")
	if s.lanes == 16 {
		mask := tailMask(n)
		CMPQ(idx, n)
		JE(LabelRef("done"))
		vx, vy := s.vec(), s.vec()
		VMOVUPS_Z(Mem{Base: x, Index: idx, Scale: 4}, mask, vx)
		VMOVUPS_Z(Mem{Base: y, Index: idx, Scale: 4}, mask, vy)
		VFMADD231PS(vx, al, vy)
		VMOVUPS(vy, mask, Mem{Base: y, Index: idx, Scale: 4})
	} else {
		Label("scalar")
		CMPQ(idx, n)
		JE(LabelRef("done"))
		vy := XMM()
		VMOVSS(Mem{Base: y, Index: idx, Scale: 4}, vy)
		VFMADD231SS(Mem{Base: x, Index: idx, Scale: 4}, al.AsX(), vy)
		VMOVSS(vy, Mem{Base: y, Index: idx, Scale: 4})
		INCQ(idx)
		JMP(LabelRef("scalar"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// reduceQuads512 reduces the rows×4 accumulators of an AVX-512 pass with the
// same tree as reduce — lane l plus lane l+8, then l+4, l+2, l+1 — but
// several accumulators per instruction, and stores row r's four sums to
// out+r·ldo. Float addition is commutative, so pairing the same lanes in
// the same tree gives bit-identical sums.
func reduceQuads512(acc [][]VecVirtual, ocur Register) { reduceQuads512At(acc, ocur, 0) }

// reduceQuads512At is reduceQuads512 storing at out+disp bytes.
func reduceQuads512At(acc [][]VecVirtual, ocur Register, disp int) {
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
	orow := GP64()
	MOVQ(ocur, orow)
	var ldo Register
	if rows > 1 {
		ldo = Load(Param("ldo"), GP64())
		SHLQ(U8(2), ldo)
	}
	for r := range rows {
		g := GP32()
		MOVL(U32(0x1111<<r), g)
		km := K()
		KMOVW(g, km)
		t := ZMM()
		VCOMPRESSPS_Z(f, km, t)
		VMOVUPS(t.AsX(), Mem{Base: orow, Disp: disp})
		if r+1 < rows {
			ADDQ(ldo, orow)
		}
	}
}

// wideCols is the number of weight rows the AVX-512 one-row kernel reads
// per pass, and prefetchPasses how many passes ahead it prefetches.
const (
	wideCols       = 8
	prefetchPasses = 1
)

// wideRows sets up the addresses of the wideCols weight rows starting at
// wcur, L bytes apart (row c is at base[c/3] + (c%3)·L, three base
// registers instead of eight), and the prefetch cursor prefetchPasses
// passes ahead. It returns the bases, to advance, the address of row c at
// byte displacement disp, and the cursor.
func wideRows(wcur, L Register) ([]GPVirtual, func(c, disp int) Mem, GPVirtual) {
	p0, p3, p6 := GP64(), GP64(), GP64()
	MOVQ(wcur, p0)
	LEAQ(Mem{Base: p0, Index: L, Scale: 2}, p3)
	ADDQ(L, p3)
	LEAQ(Mem{Base: p3, Index: L, Scale: 2}, p6)
	ADDQ(L, p6)
	bases := []GPVirtual{p0, p3, p6}
	rowMem := func(c, disp int) Mem {
		m := Mem{Base: bases[c/3], Disp: disp}
		if c%3 != 0 {
			m.Index, m.Scale = L, uint8(c%3)
		}
		return m
	}
	pf := GP64()
	LEAQ(Mem{Base: wcur, Index: L, Scale: 8}, pf)
	for range prefetchPasses - 1 {
		LEAQ(Mem{Base: pf, Index: L, Scale: 8}, pf)
	}
	return bases, rowMem, pf
}

// gemmWideR1 emits the AVX-512 one-row (decode) kernel. It is memory
// bound, so it reads wideCols weight rows per pass (more independent
// accumulators and memory streams), unrolls the K loop twice and
// prefetches the rows prefetchPasses passes ahead (the rows are
// contiguous when ldw == k, as MatMul passes them; otherwise the
// prefetches are merely useless). Each weight row still has exactly one
// accumulator marching over K in steps of 16, then the masked tail, then
// the fixed reduction tree, so every output is bit-identical to the one
// the multi-row tiles compute. Leftover rows (n % wideCols) go through a
// 4-wide and a 1-wide pass of the ordinary kernel.
func gemmWideR1(s isa, dt dtype) {
	name := fmt.Sprintf("gemm%s%sR1", s.name, dt.name)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(x *float32, ldx int, w %s, ldw int, k int, n int, out *float32, ldo int, pf uintptr)", dt.goType))
	Doc(fmt.Sprintf("%s computes 1 row of x times n rows of %s weights (see asmgen).", name, dt.name))
	const cols = wideCols
	esz := 1 << dt.shift

	k := Load(Param("k"), GP64())
	mask := tailMask(k)
	xr := []GPVirtual{Load(Param("x"), GP64()).(GPVirtual)}
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())

	Label("wide")
	CMPQ(nrem, U32(cols))
	JL(LabelRef("quad"))
	{
		L := Load(Param("ldw"), GP64())
		SHLQ(U8(dt.shift), L)
		bases, rowMem, pf := wideRows(wcur, L)
		xp := GP64()
		MOVQ(xr[0], xp)
		cnt := GP64()
		MOVQ(k, cnt)
		SHRQ(U8(5), cnt)

		acc := make([]VecVirtual, cols)
		for c := range acc {
			acc[c] = ZMM()
			VXORPS(acc[c], acc[c], acc[c])
		}
		step := func(disp int, m Op) {
			ws := make([]VecVirtual, cols)
			for c := range ws {
				ws[c] = ZMM()
				loadW(s, dt, rowMem(c, disp*esz), ws[c], m)
			}
			xv := ZMM()
			if m == nil {
				VMOVUPS(Mem{Base: xp, Disp: 4 * disp}, xv)
			} else {
				VMOVUPS_Z(Mem{Base: xp, Disp: 4 * disp}, m, xv)
			}
			for c := range cols {
				VFMADD231PS(ws[c], xv, acc[c])
			}
		}
		advance := func(elems int) {
			for _, b := range bases {
				ADDQ(U32(elems*esz), b)
			}
			ADDQ(U32(4*elems), xp)
		}
		TESTQ(cnt, cnt)
		JE(LabelRef("wodd"))
		Label("wloop")
		bytesPerIter := cols * 32 * esz
		for off := 0; off < bytesPerIter; off += 64 {
			PREFETCHT0(Mem{Base: pf, Disp: off})
		}
		step(0, nil)
		step(16, nil)
		advance(32)
		ADDQ(U32(bytesPerIter), pf)
		DECQ(cnt)
		JNE(LabelRef("wloop"))
		Label("wodd")
		TESTQ(U32(16), k)
		JE(LabelRef("wtail"))
		step(0, nil)
		advance(16)
		Label("wtail")
		TESTQ(U32(15), k)
		JE(LabelRef("wreduce"))
		step(0, mask)
		Label("wreduce")
		for g := 0; g < cols; g += 4 {
			reduceQuads512At([][]VecVirtual{acc[g : g+4]}, ocur, 4*g)
		}
		ADDQ(U32(4*cols), ocur)
		LEAQ(Mem{Base: wcur, Index: L, Scale: 8}, wcur)
		SUBQ(U32(cols), nrem)
		JMP(LabelRef("wide"))
	}

	Label("quad")
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-s.lanes), kv)
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	gemmPass(s, dt, 1, 4, xr, wcur, ocur, k, kv, mask, "q")
	SUBQ(U32(4), nrem)
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	gemmPass(s, dt, 1, 1, xr, wcur, ocur, k, kv, mask, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// axpyRows512 emits y[t] = fma(alpha[r], v[r·ldv+t], y[t]) for r = 0..rows-1
// in order, for t < n: the same per-element operations as rows calls of
// axpy, but with y held in registers across the rows (attention's sum of
// value rows weighted by the probabilities). With dt bf16, v holds bf16
// values, widened exactly to f32 before the FMA.
func axpyRows512(dt dtype) {
	name := "axpyRowsAVX512"
	if dt != dtF32 {
		name = "axpyRows" + dt.name + "AVX512"
	}
	TEXT(name, NOSPLIT, fmt.Sprintf("func(alpha *float32, v %s, ldv int, rows int, y *float32, n int)", dt.goType))
	Doc(name + " computes y[t] = fma(alpha[r], v[r*ldv+t], y[t]) for r < rows in order, t < n.")
	a := Load(Param("alpha"), GP64())
	v := Load(Param("v"), GP64())
	ldv := Load(Param("ldv"), GP64())
	SHLQ(U8(dt.shift), ldv)
	rows := Load(Param("rows"), GP64())
	y := Load(Param("y"), GP64())
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	esz := 1 << dt.shift
	block := func(lbl string, vecs int, mask Op) {
		acc := make([]VecVirtual, vecs)
		for i := range acc {
			acc[i] = ZMM()
			if mask == nil {
				VMOVUPS(Mem{Base: y, Disp: 64 * i}, acc[i])
			} else {
				VMOVUPS_Z(Mem{Base: y}, mask, acc[i])
			}
		}
		vr, ar, cnt := GP64(), GP64(), GP64()
		MOVQ(v, vr)
		MOVQ(a, ar)
		MOVQ(rows, cnt)
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "store"))
		Label(lbl + "row")
		b := ZMM()
		VBROADCASTSS(Mem{Base: ar}, b)
		for i := range acc {
			switch {
			case dt == dtF32 && mask == nil:
				VFMADD231PS(Mem{Base: vr, Disp: 64 * i}, b, acc[i])
			case dt == dtF32:
				t := ZMM()
				VMOVUPS_Z(Mem{Base: vr}, mask, t)
				VFMADD231PS(t, b, acc[i])
			default:
				t := ZMM()
				loadW(avx512, dt, Mem{Base: vr, Disp: 16 * esz * i}, t, mask)
				VFMADD231PS(t, b, acc[i])
			}
		}
		ADDQ(ldv, vr)
		ADDQ(U8(4), ar)
		DECQ(cnt)
		JNE(LabelRef(lbl + "row"))
		Label(lbl + "store")
		for i := range acc {
			if mask == nil {
				VMOVUPS(acc[i], Mem{Base: y, Disp: 64 * i})
			} else {
				VMOVUPS(acc[i], mask, Mem{Base: y})
			}
		}
		ADDQ(U32(64*vecs), y)
		ADDQ(U32(16*esz*vecs), v)
		SUBQ(U32(16*vecs), left)
	}
	vectorBlocks(left, 4, block)
}

// vectorBlocks emits the loop structure of the row-accumulating kernels
// over left elements: blocks of wide vectors while they fit, then single
// vectors, then one masked vector for the tail, then the return. block
// emits one block (labels prefixed lbl) of vecs vectors, loading with mask
// when it is set, and counts the elements off left.
func vectorBlocks(left GPVirtual, wide int, block func(lbl string, vecs int, mask Op)) {
	Label("cw")
	CMPQ(left, U32(16*wide))
	JL(LabelRef("c16"))
	block("w", wide, nil)
	JMP(LabelRef("cw"))
	Label("c16")
	CMPQ(left, U32(16))
	JL(LabelRef("ctail"))
	block("n", 1, nil)
	JMP(LabelRef("c16"))
	Label("ctail")
	TESTQ(left, left)
	JE(LabelRef("done"))
	block("t", 1, tailMask(left))
	Label("done")
	VZEROUPPER()
	RET()
}
