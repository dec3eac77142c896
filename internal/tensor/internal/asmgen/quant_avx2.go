package main

// The AVX2 quantized kernels: the same panel scheme as quant.go with 8
// weight rows in the 8 lanes of a YMM, and the integer dot products made
// with VPMADDUBSW (unsigned levels × signed activations, adjacent pairs
// summed to int16) and VPMADDWD by ones (pairs summed to int32). The
// int16 pair sums cannot saturate: the levels are at most 63 (Q6_K) and
// the activations at most 127 in magnitude, except Q8_0, whose signed
// levels go through the sign trick instead (|w| times x with w's sign), so
// the integers are exact and the results those of the definition. Only the
// 16 YMM registers of AVX2 are used, and only VEX encodings.
//
// This file holds the list of kernels (quantKernelsAVX2), the panel layouts
// and what the pack and dot kernels share; the row addressing is in
// quantrows_avx2.go, the kernels in quant32_avx2.go, quantk_avx2.go and
// quantkdot_avx2.go, and vexonly.go checks the assembly they produce.

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// splat8 returns a YMM holding the dword v in every lane.
func splat8(v uint32) VecVirtual {
	g := GP32()
	MOVL(U32(v), g)
	x := XMM()
	VMOVD(g, x)
	y := YMM()
	VPBROADCASTD(x, y)
	return y
}

// AVX2 panel layouts: those of quant32.go and quantk.go with 32-byte
// vectors, except that the K-quants' sub-block scales hold the scale in
// both int16 halves of each lane (the factors of the dot kernels'
// VPMADDWD).
const (
	panel32Bytes8 = 32 * panel32Vecs
	pk8Scales     = 64 * 32
	pk8Mins       = pk8Scales + 8*32
	pk8D          = pk8Mins + 4*32
	pk8Dmin       = pk8D + 32
	pk8Bytes      = pk8Dmin + 32
	p68Scales     = 64 * 32
	p68Pairs      = p68Scales + 16*32
	p68D          = p68Pairs + 8*32
	p68Bytes      = p68D + 32
)

// maxDot32RowsAVX2 and maxDotKRowsAVX2 bound the activation rows of one
// AVX2 dot kernel (16 registers).
const (
	maxDot32RowsAVX2 = 4
	maxDotKRowsAVX2  = 4
)

// int16Group returns how many VPMADDUBSW results (pair sums of an unsigned
// level ≤ maxLevel times an activation in [−127, 127]) a kernel sums in
// int16 before widening them: the most, dividing the steps of a block or
// sub-block, whose total stays within int16 for every input. A pair sum is
// at most 2·127·maxLevel in magnitude: Q4_K/Q4_0 (15) 3,810, so 8 (30,480);
// Q5_K/Q5_0 (31) 7,874, so 4 (31,496); Q6_K (63) 16,002, so 2 (32,004).
func int16Group(maxLevel, steps int) int {
	g := steps
	for g > 1 && (steps%g != 0 || g*2*127*maxLevel > math.MaxInt16) {
		g--
	}
	return g
}

// quantKernelsAVX2 emits the AVX2 quantized matrix kernels.
func quantKernelsAVX2() {
	pack32AVX2(quant32{"Q8_0", 34})
	pack32AVX2(quant32{"Q4_0", 18})
	pack32AVX2(quant32{"Q5_0", 22})
	for r := 1; r <= maxDot32RowsAVX2; r++ {
		for _, maxLevel := range []int{0, 15, 31} {
			dot32AVX2(r, maxLevel)
		}
	}
	packQ4KAVX2(false)
	packQ4KAVX2(true)
	packQ6KAVX2()
	for _, kd := range []kDotAVX2{kDotQ4K, kDotQ5K, kDotQ6K} {
		for r := 1; r <= maxDotKRowsAVX2; r++ {
			dotKAVX2(kd, r)
		}
	}
}
