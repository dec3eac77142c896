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
// This file holds the dot-product kernels (gemmDP, gemmDPR1) and their
// loads; the conversion of the activations is in bf16cvt.go, and the
// encoding of the two instructions, which Go's assembler does not know, in
// evexraw.go.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

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

// dpSignature is the Go signature of the BF16 dot-product kernels.
const dpSignature = "func(x *uint16, ldx int, w *uint16, ldw int, k int, n int, out *float32, ldo int, pf uintptr)"

// gemmDP emits the AVX512-BF16 kernel for rows x rows (2..4): 4 weight rows
// per pass, then the n%4 leftovers one at a time.
func gemmDP(rows int) {
	name := fmt.Sprintf("gemmDPBF16R%d", rows)
	TEXT(name, NOSPLIT, dpSignature)
	Doc(fmt.Sprintf("%s computes %d rows of bf16 x times n rows of bf16 weights (see asmgen).", name, rows))
	dpBody(rows, false)
}

// attnKeysDP emits gemmDP's kernel for rows x rows (1..4) that prefetches
// the KV stream at pf (streamLines) instead: one line per weight row per
// full K step, as many bytes as it reads where k is a multiple of 32. Its
// arithmetic is gemmDP's, instruction for instruction, so its scores have
// the bits of gemmDPBF16R1..4 (gemmDPR1's wide passes included: every
// weight row has one accumulator marching over K and the same tree).
func attnKeysDP(rows int) {
	name := fmt.Sprintf("attnKeysDPR%d", rows)
	TEXT(name, NOSPLIT, "func(x *uint16, ldx int, w *uint16, ldw int, k int, n int, out *float32, ldo int, "+streamParams+")")
	Doc(fmt.Sprintf("%s is gemmDPBF16R%d prefetching the KV stream at pf, a line per weight row per K step (see asmgen).", name, rows))
	dpBody(rows, true)
}

// dpBody is the body of gemmDP and attnKeysDP (stream).
func dpBody(rows int, stream bool) {
	k := Load(Param("k"), GP64())
	kv := GP64()
	MOVQ(k, kv)
	ANDQ(I32(-32), kv)
	mask := wordTailMask(k)
	xr := xRows(rows, 1)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())
	var pf GPVirtual
	if !stream {
		pf = Load(Param("pf"), GP64()).(GPVirtual)
	}
	Label("group")
	CMPQ(nrem, U32(4))
	JL(LabelRef("single"))
	dpPass(rows, 4, xr, wcur, ocur, k, kv, mask, pf, stream, "g")
	SUBQ(U32(4), nrem)
	JMP(LabelRef("group"))
	Label("single")
	TESTQ(nrem, nrem)
	JE(LabelRef("done"))
	dpPass(rows, 1, xr, wcur, ocur, k, kv, mask, pf, stream, "s")
	DECQ(nrem)
	JMP(LabelRef("single"))
	Label("done")
	VZEROUPPER()
	RET()
}

// dpPass emits one rows×cols register tile over the whole K and advances
// wcur by cols weight rows and ocur by cols outputs. With pf set, every full
// K step prefetches two lines at pf (the region the driver wants warm) and
// advances it by 128 bytes: the same bytes per tile as the f32-activation
// kernels, which step half as far. The prefetches go to the L2
// (PREFETCHT1), not the L1: on a Zen 4 the next panel's lines brought into
// the 48 KiB L1 beside the tiles' x rows and current panel evicted what the
// tiles were reading, and a 16-row bf16 product from DRAM ran at 101–126
// GFLOP/s a thread against 182–185 into the L2 (batched decode −17 to −24%,
// docs/performance-log.md). With stream, every full K step prefetches cols
// lines of the KV stream (streamLines) instead.
func dpPass(rows, cols int, xr []GPVirtual, wcur, ocur, k, kv Register, mask Op, pf GPVirtual, stream bool, p string) {
	wr := weightRows(wcur, 1, cols)

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
		PREFETCHT1(Mem{Base: pf})
		PREFETCHT1(Mem{Base: pf, Disp: 64})
		ADDQ(U32(128), pf)
	}
	if stream {
		streamLines(cols)
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
	outRows(ocur, rows, func(r int, orow GPVirtual) { VMOVSS(reduce(avx512, acc[r][0]), Mem{Base: orow}) })
	ADDQ(U32(4), ocur)
}

// gemmDPR1 emits the one-row (decode) AVX512-BF16 kernel. Like gemmWideR1
// it is memory bound, so it reads wideCols weight rows per pass, one from
// each of wideCols streams, and unrolls the K loop twice; every weight
// row still has one accumulator marching over K in steps of 32, then the
// masked tail, then the fixed tree, bit-identical to the multi-row tiles.
func gemmDPR1() {
	TEXT("gemmDPBF16R1", NOSPLIT, dpSignature)
	Doc("gemmDPBF16R1 computes 1 row of bf16 x times n rows of bf16 weights (see asmgen).")
	k := Load(Param("k"), GP64())
	mask := wordTailMask(k)
	xr := xRows(1, 1)
	wcur := Load(Param("w"), GP64())
	ocur := Load(Param("out"), GP64())
	nrem := Load(Param("n"), GP64())

	wideKernel{
		elems:  32,
		wshift: 1,
		xsize:  2,
		loadW:  loadWords,
		loadX:  loadWords,
		madd:   vdpbf16ps,
		pass: func(cols int, kv Register, p string) {
			dpPass(1, cols, xr, wcur, ocur, k, kv, mask, nil, false, p)
		},
	}.emitWide(k, wcur, ocur, nrem, xr[0], mask)
}
