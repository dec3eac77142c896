package main

// The instruction sets and weight types the kernels are generated for (isa,
// dtype), and the primitives every kernel family builds on: the AVX-512 tail
// mask, the weights' widening loads, each instruction set's fixed reduction
// tree (the accumulation structure of the package doc, main.go) and the K
// loop's index register (idx, i).

import (
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

// idx is the element index register of the K loop being emitted.
var idx GPVirtual

func i() Register { return idx }
