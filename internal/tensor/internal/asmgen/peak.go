package main

// The peak kernels: loops of one arithmetic instruction (or the AVX2
// int8 sequence) over independent register accumulators and nothing else,
// no memory operand, no other dependency, so they run at the rate the
// core issues that instruction: the arithmetic ceiling of the matrix
// kernels that use it (package tensor's PeakOps, `tandem bench model`).
//
// Every operand lane holds 1 (f32 1.0, bf16 1.0, or bytes of 1), so each
// accumulator lane ends as iters times the multiply-adds the instruction
// does per lane: the sums the kernels store count their own arithmetic,
// and the tests compare them with the count the FLOP rates assume.

import (
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// peakAccs is the number of independent accumulators of a peak kernel:
// more than latency × issue rate of any of the instructions on the cores
// the kernels are tuned for (FMA: 4 cycles × 2 pipes on Zen 4 and Intel;
// VPDPBUSD and VDPBF16PS: 4–5 cycles × 1–2 per cycle), and within AVX2's
// 16 registers beside the operands.
const peakAccs = 12

// peakInt8AVX2Accs is peakInt8AVX2's accumulator count: each chain also
// needs a temporary for its products, so fewer fit AVX2's 16 registers;
// the chains' own dependency is one VPADDD (1 cycle), so 8 are plenty.
const peakInt8AVX2Accs = 8

// peakKernels emits the peak kernels.
func peakKernels() {
	f32 := func(x, acc VecVirtual) { VADDPS(x, acc, acc) }
	i32 := func(x, acc VecVirtual) { VPADDD(x, acc, acc) }
	peakLoop("peakFMAAVX2", "VFMADD231PS ymm", false, peakAccs, func() func(acc VecVirtual) {
		one := splat8(0x3f800000)
		return func(acc VecVirtual) { VFMADD231PS(one, one, acc) }
	}, f32)
	peakLoop("peakFMAAVX512", "VFMADD231PS zmm", false, peakAccs, func() func(acc VecVirtual) {
		one := splat(0x3f800000)
		return func(acc VecVirtual) { VFMADD231PS(one, one, acc) }
	}, f32)
	peakLoop("peakDPBF16", "VDPBF16PS zmm", false, peakAccs, func() func(acc VecVirtual) {
		one := splat(0x3f803f80) // bf16 1.0 in both halves of every dword
		return func(acc VecVirtual) { vdpbf16ps(one, one, acc) }
	}, f32)
	peakLoop("peakVNNI", "VPDPBUSD zmm", true, peakAccs, func() func(acc VecVirtual) {
		ones := splat(0x01010101)
		return func(acc VecVirtual) { vpdpbusd(ones, ones, acc, false) }
	}, i32)
	// The AVX2 quantized kernels' products (quant_avx2.go): VPMADDUBSW
	// (32 u8·s8 products, adjacent pairs summed to int16), VPMADDWD by
	// ones (pairs summed to int32) and VPADDD into the accumulator. The
	// kernels sum up to 8 VPMADDUBSW results with VPADDW before one
	// VPMADDWD (int16Group), so per product they issue a little less than
	// this sequence; its rate is the ceiling of a product widened at once.
	peakLoop("peakInt8AVX2", "VPMADDUBSW+VPMADDWD+VPADDD ymm", true, peakInt8AVX2Accs, func() func(acc VecVirtual) {
		bytes := splat8(0x01010101)
		words := splat8(0x00010001)
		return func(acc VecVirtual) {
			t := YMM()
			VPMADDUBSW(bytes, bytes, t)
			VPMADDWD(words, t, t)
			VPADDD(t, acc, acc)
		}
	}, i32)
}

// peakLoop emits a peak kernel: accs accumulators (ZMM if the name says
// AVX512 or the instruction is one only AVX-512 has, else YMM), iters
// passes of the operation setup returns over every accumulator, then the
// accumulators summed by add and stored at out, as int32 lanes if ints
// else float32.
func peakLoop(name, what string, ints bool, accs int, setup func() func(acc VecVirtual), add func(x, acc VecVirtual)) {
	elem := "float32"
	if ints {
		elem = "int32"
	}
	wide := !strings.HasSuffix(name, "AVX2")
	TEXT(name, NOSPLIT, fmt.Sprintf("func(iters int, out *%s)", elem))
	Doc(fmt.Sprintf("%s runs iters passes of %s over %d independent accumulators and stores their lane sums at out (operands of 1: each lane ends as iters·%d times the products one instruction does per lane).", name, what, accs, accs))
	n := Load(Param("iters"), GP64())
	out := Load(Param("out"), GP64())
	op := setup()
	acc := make([]VecVirtual, accs)
	for i := range acc {
		if wide {
			acc[i] = ZMM()
		} else {
			acc[i] = YMM()
		}
		VXORPS(acc[i], acc[i], acc[i])
	}
	loop, done := name+"_loop", name+"_done"
	TESTQ(n, n)
	JLE(LabelRef(done))
	Label(loop)
	for _, a := range acc {
		op(a)
	}
	DECQ(n)
	JNZ(LabelRef(loop))
	Label(done)
	for w := len(acc); w > 1; {
		h := (w + 1) / 2
		for i := h; i < w; i++ {
			add(acc[i], acc[i-h])
		}
		w = h
	}
	VMOVUPS(acc[0], Mem{Base: out})
	VZEROUPPER()
	RET()
}
