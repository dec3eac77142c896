package main

// The AVX-512 one-row (decode) kernels gemmAVX512<dtype>R1: wideCols weight
// rows a pass from three base registers (wideRows), the K loop unrolled
// twice and prefetched prefetchPasses passes ahead; the leftover rows go
// through gemm.go's passes. dpbf16.go's one-row kernel shares the body
// (wideKernel.emitWide) with its own loads and products.

import (
	"fmt"
	"math/bits"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

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

// wideKernel is what tells the AVX-512 one-row kernels apart (gemmWideR1:
// f32 x by f32, bf16 or f16 weights with FMAs; gemmDPR1: bf16 by bf16 with
// VDPBF16PS); emitWide emits the body they share.
type wideKernel struct {
	elems  int   // elements per vector step: 16 f32 lanes, or 32 bf16
	wshift uint8 // log2 of the bytes per weight element
	xsize  int   // bytes per x element
	// loadW and loadX load one step's weights or x at m into dst; with a
	// mask the masked-off elements are zero and not read.
	loadW, loadX func(m Mem, dst VecVirtual, mask Op)
	madd         func(w, x, acc VecVirtual) // acc += the products of w and x
	// pass emits the ordinary kernel's pass over cols weight rows (labels
	// prefixed p), for the rows left over; kv is k rounded down to a step.
	pass func(cols int, kv Register, p string)
}

// emitWide emits a one-row kernel's body from label wide on: while nrem ≥
// wideCols, a pass over wideCols weight rows from wcur (one accumulator a
// row, the K loop unrolled twice and prefetched, an odd step, the masked
// tail step with mask, the fixed tree into ocur); then the leftover rows
// four and one at a time through pass; then the return. x is the x row's
// register and k its length.
func (w wideKernel) emitWide(k, wcur, ocur, nrem Register, x GPVirtual, mask Op) {
	const cols = wideCols
	wsize := 1 << w.wshift
	Label("wide")
	CMPQ(nrem, U32(cols))
	JL(LabelRef("quad"))
	{
		L := Load(Param("ldw"), GP64())
		SHLQ(U8(w.wshift), L)
		bases, rowMem, pf := wideRows(wcur, L)
		xp := GP64()
		MOVQ(x, xp)
		cnt := GP64() // trips of two steps
		MOVQ(k, cnt)
		SHRQ(U8(bits.TrailingZeros(uint(2*w.elems))), cnt)

		acc := make([]VecVirtual, cols)
		for c := range acc {
			acc[c] = ZMM()
			VXORPS(acc[c], acc[c], acc[c])
		}
		step := func(disp int, m Op) {
			ws := make([]VecVirtual, cols)
			for c := range ws {
				ws[c] = ZMM()
				w.loadW(rowMem(c, wsize*disp), ws[c], m)
			}
			xv := ZMM()
			w.loadX(Mem{Base: xp, Disp: w.xsize * disp}, xv, m)
			for c := range cols {
				w.madd(ws[c], xv, acc[c])
			}
		}
		advance := func(elems int) {
			for _, b := range bases {
				ADDQ(U32(wsize*elems), b)
			}
			ADDQ(U32(w.xsize*elems), xp)
		}
		TESTQ(cnt, cnt)
		JE(LabelRef("wodd"))
		Label("wloop")
		bytesPerIter := cols * 2 * w.elems * wsize
		for off := 0; off < bytesPerIter; off += 64 {
			PREFETCHT0(Mem{Base: pf, Disp: off})
		}
		step(0, nil)
		step(w.elems, nil)
		advance(2 * w.elems)
		ADDQ(U32(bytesPerIter), pf)
		DECQ(cnt)
		JNE(LabelRef("wloop"))
		Label("wodd")
		TESTQ(U32(w.elems), k)
		JE(LabelRef("wtail"))
		step(0, nil)
		advance(w.elems)
		Label("wtail")
		TESTQ(U32(w.elems-1), k)
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
	ANDQ(I32(-w.elems), kv)
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	w.pass(4, kv, "q")
	SUBQ(U32(4), nrem)
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	w.pass(1, kv, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
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

	k := Load(Param("k"), GP64())
	mask := tailMask(k)
	xr := []GPVirtual{Load(Param("x"), GP64()).(GPVirtual)}
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())

	wideKernel{
		elems:  s.lanes,
		wshift: dt.shift,
		xsize:  4,
		loadW:  func(m Mem, dst VecVirtual, mask Op) { loadW(s, dt, m, dst, mask) },
		loadX:  func(m Mem, dst VecVirtual, mask Op) { loadW(s, dtF32, m, dst, mask) },
		madd:   func(w, x, acc VecVirtual) { VFMADD231PS(w, x, acc) },
		pass: func(cols int, kv Register, p string) {
			gemmPass(s, dt, 1, cols, xr, wcur, ocur, k, kv, mask, p)
		},
	}.emitWide(k, wcur, ocur, nrem, xr[0], mask)
}
