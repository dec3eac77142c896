package main

// The AVX-512 one-row (decode) kernels gemmAVX512<dtype>R1: wideCols weight
// rows a pass from three base registers (wideRows, which dpbf16.go's one-row
// kernel shares), the K loop unrolled twice and prefetched prefetchPasses
// passes ahead; the leftover rows go through gemm.go's passes.

import (
	"fmt"

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
