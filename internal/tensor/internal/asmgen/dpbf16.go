package main

// The AVX512-BF16 kernels multiply bf16 activations by bf16 weights with
// VDPBF16PS, which multiplies 32 pairs of bf16 values and adds each
// adjacent pair of products into one of 16 f32 lanes: twice the arithmetic
// of an f32 FMA per instruction, with no widening of the weights. The
// activations are rounded to bf16 once per matrix product (VCVTNEPS2BF16,
// round to nearest even), as llama.cpp does for bf16 weights.
//
// Accumulation structure of every dot product these kernels compute: one
// 16-lane accumulator marches over K in steps of 32 elements; the last
// partial step loads zeros in the masked-off elements; the 16 lanes are then
// reduced by the same fixed tree as the f32 AVX-512 kernels.
//
// Neither Go's assembler nor avo knows VDPBF16PS or VCVTNEPS2BF16. The
// generator emits them as pseudo-instructions with their register operands
// declared, so avo's register allocator treats them like any other
// instruction, and rawEncode then replaces each of them in the output by its
// EVEX encoding (BYTE directives).

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// vdpbf16ps emits acc += Σpairs a·b (Go operand order: b, a, acc).
func vdpbf16ps(b, a, acc VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VDPBF16PS",
		Operands: []Op{b, a, acc},
		Inputs:   []Op{b, a, acc},
		Outputs:  []Op{acc},
	})
}

// vcvtneps2bf16 emits dst (16 bf16 in a YMM) = src (16 f32 in a ZMM)
// rounded to nearest even.
func vcvtneps2bf16(src, dst VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VCVTNEPS2BF16",
		Operands: []Op{src, dst},
		Inputs:   []Op{src},
		Outputs:  []Op{dst},
	})
}

// evex returns the EVEX encoding of a 512-bit, W0, 0F38-map instruction
// with register operands only: reg is ModRM.reg (the destination), vvvv the
// second source (0 and unused when the instruction has none, encoded as
// 1111), rm ModRM.rm. pp selects the mandatory prefix (1: 66, 2: F3, 3: F2).
func evex(pp byte, opcode byte, reg, vvvv, rm int, hasV bool) []byte {
	bit := func(v, b int) byte { return byte(v>>b) & 1 }
	p0 := (1-bit(reg, 3))<<7 | (1-bit(rm, 4))<<6 | (1-bit(rm, 3))<<5 | (1-bit(reg, 4))<<4 | 0b10
	vv, vhi := byte(0b1111), byte(1)
	if hasV {
		vv, vhi = ^byte(vvvv)&0b1111, 1-bit(vvvv, 4)
	}
	p1 := vv<<3 | 1<<2 | pp
	p2 := byte(0b10)<<5 | vhi<<3
	modrm := 0b11<<6 | byte(reg&7)<<3 | byte(rm&7)
	return []byte{0x62, p0, p1, p2, opcode, modrm}
}

// encodeDPBF16PS encodes VDPBF16PS zmm(dst), zmm(src1), zmm(src2) — Go
// operand order src2, src1, dst.
func encodeDPBF16PS(src2, src1, dst int) []byte { return evex(2, 0x52, dst, src1, src2, true) }

// encodeCVTNEPS2BF16 encodes VCVTNEPS2BF16 ymm(dst), zmm(src).
func encodeCVTNEPS2BF16(src, dst int) []byte { return evex(2, 0x72, dst, 0, src, false) }

var rawLine = regexp.MustCompile(`^(\s*)(VDPBF16PS|VCVTNEPS2BF16)\s+(.*)$`)
var rawReg = regexp.MustCompile(`^[XYZ](\d+)$`)

// rawEncode rewrites the pseudo-instructions in the generated assembly at
// path into BYTE directives, keeping the mnemonic as a comment.
func rawEncode(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for n, line := range bytes.SplitAfter(src, []byte("\n")) {
		m := rawLine.FindSubmatch(bytes.TrimRight(line, "\n"))
		if m == nil {
			out.Write(line)
			continue
		}
		var regs []int
		for _, op := range bytes.Split(m[3], []byte(",")) {
			r := rawReg.FindSubmatch(bytes.TrimSpace(op))
			if r == nil {
				return fmt.Errorf("%s:%d: %s: operand %q is not a vector register", path, n+1, m[2], op)
			}
			v, _ := strconv.Atoi(string(r[1]))
			regs = append(regs, v)
		}
		var enc []byte
		switch {
		case string(m[2]) == "VDPBF16PS" && len(regs) == 3:
			enc = encodeDPBF16PS(regs[0], regs[1], regs[2])
		case string(m[2]) == "VCVTNEPS2BF16" && len(regs) == 2:
			enc = encodeCVTNEPS2BF16(regs[0], regs[1])
		default:
			return fmt.Errorf("%s:%d: %s: want 3 or 2 register operands", path, n+1, m[2])
		}
		fmt.Fprintf(&out, "%s// %s %s\n%s", m[1], m[2], m[3], m[1])
		for i, b := range enc {
			if i > 0 {
				out.WriteString("; ")
			}
			fmt.Fprintf(&out, "BYTE $0x%02x", b)
		}
		out.WriteString("\n")
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// wordTailMask loads into a mask register the elements of the last partial
// 32-element step of a length-k loop: bit t is set for t < k%32.
func wordTailMask(k Register) OpmaskVirtual {
	t := GP32()
	MOVL(k.(GPVirtual).As32(), t)
	ANDL(U32(31), t)
	ones := GP32()
	MOVL(U32(0xffffffff), ones)
	m := GP32()
	BZHIL(t, ones, m)
	km := K()
	KMOVD(m, km)
	return km
}

// loadWords loads 32 bf16 values at m into dst; with a mask the masked-off
// elements are zero and their memory is not touched.
func loadWords(m Mem, dst VecVirtual, mask Op) {
	if mask == nil {
		VMOVDQU16(m, dst)
	} else {
		VMOVDQU16_Z(m, mask, dst)
	}
}

// cvtBF16 emits the f32 → bf16 conversion of the activations.
func cvtBF16() {
	TEXT("cvtBF16AVX512", NOSPLIT, "func(x *float32, out *uint16, n int)")
	Doc("cvtBF16AVX512 rounds x[t] to bf16 (nearest even) into out[t] for t < n.")
	x := Load(Param("x"), GP64())
	o := Load(Param("out"), GP64())
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	Label("loop")
	CMPQ(left, U32(16))
	JL(LabelRef("tail"))
	v, h := ZMM(), YMM()
	VMOVUPS(Mem{Base: x}, v)
	vcvtneps2bf16(v, h)
	VMOVDQU(h, Mem{Base: o})
	ADDQ(U32(64), x)
	ADDQ(U32(32), o)
	SUBQ(U32(16), left)
	JMP(LabelRef("loop"))
	Label("tail")
	TESTQ(left, left)
	JE(LabelRef("done"))
	mask := tailMask(left)
	v2, h2 := ZMM(), YMM()
	VMOVUPS_Z(Mem{Base: x}, mask, v2)
	vcvtneps2bf16(v2, h2)
	VMOVDQU16(h2, mask, Mem{Base: o})
	Label("done")
	VZEROUPPER()
	RET()
}

// dpSignature is the Go signature of the BF16 dot-product kernels.
const dpSignature = "func(x *uint16, ldx int, w *uint16, ldw int, k int, n int, out *float32, ldo int, pf uintptr)"

// gemmDP emits the AVX512-BF16 kernel for rows x rows (2..4): 4 weight rows
// per pass, then the n%4 leftovers one at a time.
func gemmDP(rows int) {
	name := fmt.Sprintf("gemmDPBF16R%d", rows)
	TEXT(name, NOSPLIT, dpSignature)
	Doc(fmt.Sprintf("%s computes %d rows of bf16 x times n rows of bf16 weights (see asmgen).", name, rows))
	k := Load(Param("k"), GP64())
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-32), kv)
	mask := wordTailMask(k)
	xr := dpRows(rows)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	Label("group")
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	dpPass(rows, 4, xr, wcur, ocur, k, kv, mask, pf, "g")
	SUBQ(U32(4), nrem)
	JMP(LabelRef("group"))
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	dpPass(rows, 1, xr, wcur, ocur, k, kv, mask, pf, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// dpRows loads the addresses of the kernel's x rows.
func dpRows(rows int) []GPVirtual {
	xr := make([]GPVirtual, rows)
	xr[0] = Load(Param("x"), GP64()).(GPVirtual)
	if rows > 1 {
		ldx := Load(Param("ldx"), GP64())
		SHLQ(U8(1), ldx)
		for r := 1; r < rows; r++ {
			xr[r] = GP64()
			LEAQ(Mem{Base: xr[r-1], Index: ldx, Scale: 1}, xr[r])
		}
	}
	return xr
}

// dpPass emits one rows×cols register tile over the whole K and advances
// wcur by cols weight rows and ocur by cols outputs. With pf set, every full
// K step prefetches two lines at pf (the region the driver wants warm) and
// advances it by 128 bytes: the same bytes per tile as the f32-activation
// kernels, which step half as far.
func dpPass(rows, cols int, xr []GPVirtual, wcur, ocur, k, kv Register, mask Op, pf GPVirtual, p string) {
	ldw := Load(Param("ldw"), GP64())
	SHLQ(U8(1), ldw)
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
			acc[r][c] = ZMM()
			VXORPS(acc[r][c], acc[r][c], acc[r][c])
		}
	}
	ix := GP64()
	step := func(m Op) {
		ws := make([]VecVirtual, cols)
		for c := range ws {
			ws[c] = ZMM()
			loadWords(Mem{Base: wr[c], Index: ix, Scale: 2}, ws[c], m)
		}
		for r := range rows {
			xv := ZMM()
			loadWords(Mem{Base: xr[r], Index: ix, Scale: 2}, xv, m)
			for c := range cols {
				vdpbf16ps(ws[c], xv, acc[r][c])
			}
		}
	}
	XORQ(ix, ix)
	TESTQ(kv, kv)
	JE(LabelRef(p + "tail"))
	Label(p + "loop")
	if pf != nil {
		PREFETCHT0(Mem{Base: pf})
		PREFETCHT0(Mem{Base: pf, Disp: 64})
		ADDQ(U32(128), pf)
	}
	step(nil)
	ADDQ(U32(32), ix)
	CMPQ(ix, kv)
	JL(LabelRef(p + "loop"))
	Label(p + "tail")
	CMPQ(ix, k)
	JE(LabelRef(p + "reduce"))
	step(mask)
	Label(p + "reduce")
	if cols == 4 {
		reduceQuads512(acc, ocur)
		ADDQ(U32(16), ocur)
		return
	}
	orow := GP64()
	MOVQ(ocur, orow)
	var ldo Register
	if rows > 1 {
		ldo = Load(Param("ldo"), GP64())
		SHLQ(U8(2), ldo)
	}
	for r := range rows {
		VMOVSS(reduce(avx512, acc[r][0]), Mem{Base: orow})
		if r+1 < rows {
			ADDQ(ldo, orow)
		}
	}
	ADDQ(U32(4), ocur)
}

// gemmDPR1 emits the one-row (decode) AVX512-BF16 kernel. Like gemmWideR1
// it is memory bound, so it reads wideCols weight rows per pass, unrolls
// the K loop twice and prefetches the rows of the next pass; every weight
// row still has one accumulator marching over K in steps of 32, then the
// masked tail, then the fixed tree, bit-identical to the multi-row tiles.
func gemmDPR1() {
	const cols = wideCols
	TEXT("gemmDPBF16R1", NOSPLIT, dpSignature)
	Doc("gemmDPBF16R1 computes 1 row of bf16 x times n rows of bf16 weights (see asmgen).")
	k := Load(Param("k"), GP64())
	mask := wordTailMask(k)
	xr := dpRows(1)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())

	Label("wide")
	CMPQ(nrem, U32(cols))
	JL(LabelRef("quad"))
	{
		L := Load(Param("ldw"), GP64())
		SHLQ(U8(1), L)
		bases, rowMem, pf := wideRows(wcur, L)
		xp := GP64()
		MOVQ(xr[0], xp)
		cnt := GP64()
		MOVQ(k, cnt)
		SHRQ(U8(6), cnt)

		acc := make([]VecVirtual, cols)
		for c := range acc {
			acc[c] = ZMM()
			VXORPS(acc[c], acc[c], acc[c])
		}
		step := func(disp int, m Op) {
			ws := make([]VecVirtual, cols)
			for c := range ws {
				ws[c] = ZMM()
				loadWords(rowMem(c, 2*disp), ws[c], m)
			}
			xv := ZMM()
			loadWords(Mem{Base: xp, Disp: 2 * disp}, xv, m)
			for c := range cols {
				vdpbf16ps(ws[c], xv, acc[c])
			}
		}
		advance := func(elems int) {
			for _, b := range bases {
				ADDQ(U32(2*elems), b)
			}
			ADDQ(U32(2*elems), xp)
		}
		TESTQ(cnt, cnt)
		JE(LabelRef("wodd"))
		Label("wloop")
		const bytesPerIter = cols * 64 * 2
		for off := 0; off < bytesPerIter; off += 64 {
			PREFETCHT0(Mem{Base: pf, Disp: off})
		}
		step(0, nil)
		step(32, nil)
		advance(64)
		ADDQ(U32(bytesPerIter), pf)
		DECQ(cnt)
		JNE(LabelRef("wloop"))
		Label("wodd")
		TESTQ(U32(32), k)
		JE(LabelRef("wtail"))
		step(0, nil)
		advance(32)
		Label("wtail")
		TESTQ(U32(31), k)
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
	ANDQ(I32(-32), kv)
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	dpPass(1, 4, xr, wcur, ocur, k, kv, mask, nil, "q")
	SUBQ(U32(4), nrem)
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	dpPass(1, 1, xr, wcur, ocur, k, kv, mask, nil, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// axpyRowsGroup emits the grouped form of axpyRowsBF16 for g outputs that
// share the value rows (the query heads of one GQA group):
// y[h·ldy+t] = fma(alpha[h·lda+r], v[r·ldv+t], y[h·ldy+t]) for h < g, r <
// rows in order, t < n. Each output element sees exactly the operations
// axpyRowsBF16 applies to it, so results are bit-identical; every value
// vector is loaded and widened once for the g outputs.
func axpyRowsGroup(g int) {
	name := fmt.Sprintf("axpyRowsBF16G%dAVX512", g)
	TEXT(name, NOSPLIT, "func(alpha *float32, lda int, v *uint16, ldv int, rows int, y *float32, ldy int, n int)")
	Doc(fmt.Sprintf("%s computes y[h*ldy+t] = fma(alpha[h*lda+r], v[r*ldv+t], y[h*ldy+t]) for h < %d, r < rows in order, t < n.", name, g))
	a := Load(Param("alpha"), GP64())
	lda := Load(Param("lda"), GP64())
	SHLQ(U8(2), lda)
	v := Load(Param("v"), GP64())
	ldv := Load(Param("ldv"), GP64())
	SHLQ(U8(1), ldv)
	rows := Load(Param("rows"), GP64())
	y := Load(Param("y"), GP64())
	ldy := Load(Param("ldy"), GP64())
	SHLQ(U8(2), ldy)
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	// Output h's row is at y + h·ldy: y or y2 = y + 2·ldy, plus ldy for odd h.
	block := func(lbl string, vecs int, mask Op) {
		var y2 GPVirtual
		if g > 2 {
			y2 = GP64()
			LEAQ(Mem{Base: y, Index: ldy, Scale: 2}, y2)
		}
		ym := func(h, disp int) Mem {
			m := Mem{Base: y, Disp: disp}
			if h >= 2 {
				m.Base = y2
			}
			if h%2 == 1 {
				m.Index, m.Scale = ldy, 1
			}
			return m
		}
		acc := make([][]VecVirtual, g)
		for h := range g {
			acc[h] = make([]VecVirtual, vecs)
			for i := range vecs {
				acc[h][i] = ZMM()
				if mask == nil {
					VMOVUPS(ym(h, 64*i), acc[h][i])
				} else {
					VMOVUPS_Z(ym(h, 0), mask, acc[h][i])
				}
			}
		}
		vr, ar, cnt := GP64(), GP64(), GP64()
		MOVQ(v, vr)
		MOVQ(a, ar)
		MOVQ(rows, cnt)
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "store"))
		Label(lbl + "row")
		vals := make([]VecVirtual, vecs)
		for i := range vecs {
			vals[i] = ZMM()
			loadW(avx512, dtBF16, Mem{Base: vr, Disp: 32 * i}, vals[i], mask)
		}
		ah := GP64()
		MOVQ(ar, ah)
		for h := range g {
			b := ZMM()
			VBROADCASTSS(Mem{Base: ah}, b)
			for i := range vecs {
				VFMADD231PS(vals[i], b, acc[h][i])
			}
			if h+1 < g {
				ADDQ(lda, ah)
			}
		}
		ADDQ(ldv, vr)
		ADDQ(U8(4), ar)
		DECQ(cnt)
		JNE(LabelRef(lbl + "row"))
		Label(lbl + "store")
		for h := range g {
			for i := range vecs {
				if mask == nil {
					VMOVUPS(acc[h][i], ym(h, 64*i))
				} else {
					VMOVUPS(acc[h][i], mask, ym(h, 0))
				}
			}
		}
		ADDQ(U32(64*vecs), y)
		ADDQ(U32(32*vecs), v)
		SUBQ(U32(16*vecs), left)
	}
	wide := 4
	if g > 3 {
		wide = 3 // g·wide accumulators + wide values + a broadcast fit 32 registers
	}
	vectorBlocks(left, wide, block)
}

// prefetchRows emits a loop of PREFETCHT0 over rows rows of lines cache
// lines each, ld bytes apart: warming the next block of a paged KV cache
// while the current one is computed on.
func prefetchRows() {
	TEXT("prefetchRows", NOSPLIT, "func(p uintptr, ld int, rows int, lines int)")
	Doc("prefetchRows prefetches lines cache lines at p + r*ld for r < rows.")
	p := Load(Param("p"), GP64())
	ld := Load(Param("ld"), GP64())
	rows := Load(Param("rows"), GP64())
	lines := Load(Param("lines"), GP64())
	TESTQ(rows, rows)
	JE(LabelRef("done"))
	TESTQ(lines, lines)
	JE(LabelRef("done"))
	Label("row")
	q, l := GP64(), GP64()
	MOVQ(p, q)
	MOVQ(lines, l)
	Label("line")
	PREFETCHT0(Mem{Base: q})
	ADDQ(U32(64), q)
	DECQ(l)
	JNE(LabelRef("line"))
	ADDQ(ld, p)
	DECQ(rows)
	JNE(LabelRef("row"))
	Label("done")
	RET()
}

// cvtBF16Stream emits cvtBF16 for whole 16-element groups with
// non-temporal stores (out must be 32-byte aligned): rows written to a KV
// cache that will not be read again soon, so neither the read for ownership
// nor the cache pollution of ordinary stores is paid. It ends with SFENCE,
// so the rows are visible to other threads like ordinary stores.
func cvtBF16Stream() {
	TEXT("cvtBF16StreamAVX512", NOSPLIT, "func(x *float32, out *uint16, n int)")
	Doc("cvtBF16StreamAVX512 rounds x[t] to bf16 into out[t] for t < n (n a multiple of 16, out 32-byte aligned) with non-temporal stores.")
	x := Load(Param("x"), GP64())
	o := Load(Param("out"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(U8(4), n)
	TESTQ(n, n)
	JE(LabelRef("done"))
	Label("loop")
	v, h := ZMM(), YMM()
	VMOVUPS(Mem{Base: x}, v)
	vcvtneps2bf16(v, h)
	VMOVNTDQ(h, Mem{Base: o})
	ADDQ(U32(64), x)
	ADDQ(U32(32), o)
	DECQ(n)
	JNE(LabelRef("loop"))
	Label("done")
	SFENCE()
	VZEROUPPER()
	RET()
}
