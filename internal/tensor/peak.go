package tensor

import (
	"runtime"
	"time"
)

// Peak names an arithmetic instruction of the matrix kernels (or the
// instruction sequence the AVX2 quantized kernels multiply with) whose
// rate PeakOps and PeakRate measure: the ceiling of a prefill product on
// the kernels that use it, as the stream read is decode's. The rates are
// operations per second with a multiply-add counted as 2 operations (a
// FLOP for f32 and bf16; for the int8 instructions one u8·s8 product and
// its add count 2), so they compare directly with a product's 2·M·N·K
// divided by its time.
type Peak int

const (
	// PeakFMA256 is VFMADD231PS on YMM: 8 f32 multiply-adds. The avx2
	// kernel set's f32, bf16 and f16 products use it.
	PeakFMA256 Peak = iota
	// PeakFMA512 is VFMADD231PS on ZMM: 16 f32 multiply-adds. The
	// avx512 sets' f32 and f16 products and avx512's bf16 use it.
	PeakFMA512
	// PeakBF16Dot is VDPBF16PS on ZMM (AVX512-BF16): 16 lanes of two
	// bf16 multiply-adds into f32. The avx512bf16 set's bf16 products
	// use it.
	PeakBF16Dot
	// PeakVNNI is VPDPBUSD on ZMM (AVX512-VNNI): 16 lanes of four u8·s8
	// multiply-adds into int32. The avx512vnni quantized kernels use it.
	PeakVNNI
	// PeakInt8AVX2 is VPMADDUBSW, VPMADDWD by ones and VPADDD on YMM:
	// 32 u8·s8 multiply-adds into int32. The avx2 quantized kernels use
	// it (summing up to 8 VPMADDUBSW results before one VPMADDWD, a
	// little less work per product than this sequence).
	PeakInt8AVX2
	// PeakAMXBF16 is TDPBF16PS on full tiles (AMX-BF16): 16×16 outputs
	// of 32 bf16 multiply-adds into f32. The amxbf16 set's bf16 products
	// use it.
	PeakAMXBF16
	// PeakAMXInt8 is TDPBSUD on full tiles (AMX-INT8): 16×16 outputs of
	// 64 s8·u8 multiply-adds into int32. The amx quantized kernels use it
	// for groups of 16 activation rows (blocks of 32 or 16 a product).
	PeakAMXInt8
	numPeaks
)

// Peaks lists every Peak, f32 first.
var Peaks = []Peak{PeakFMA256, PeakFMA512, PeakBF16Dot, PeakVNNI, PeakInt8AVX2, PeakAMXBF16, PeakAMXInt8}

// String names the arithmetic and its instruction, e.g. "f32 FMA zmm
// (VFMADD231PS)".
func (p Peak) String() string {
	switch p {
	case PeakFMA256:
		return "f32 FMA ymm (VFMADD231PS)"
	case PeakFMA512:
		return "f32 FMA zmm (VFMADD231PS)"
	case PeakBF16Dot:
		return "bf16 dot zmm (VDPBF16PS)"
	case PeakVNNI:
		return "int8 dot zmm (VPDPBUSD)"
	case PeakInt8AVX2:
		return "int8 dot ymm (VPMADDUBSW+VPMADDWD)"
	case PeakAMXBF16:
		return "bf16 tile dot (TDPBF16PS)"
	case PeakAMXInt8:
		return "int8 tile dot (TDPBSUD)"
	}
	return "unknown peak"
}

// Available reports whether this CPU (and build) can run p's kernel.
func (p Peak) Available() bool {
	return p >= 0 && p < numPeaks && peakKernels[p].run != nil
}

// peakKernel is the loop measuring one Peak: run does iters passes of
// macs multiply-adds (one pass is an instruction on every accumulator)
// and returns the sum of its accumulators' lanes, which, its operands
// being 1, is the count of multiply-adds it did.
type peakKernel struct {
	run  func(iters int) float64
	macs int
}

// PeakOps runs p's kernel, iters passes, on the calling thread and returns
// the operations it did (2 a multiply-add), or 0 where p is not Available.
// Time it to get a rate: `tandem bench model` runs it on every thread at
// once, as the prefill products run.
func PeakOps(p Peak, iters int) float64 {
	if !p.Available() || iters <= 0 {
		return 0
	}
	peakKernels[p].run(iters)
	return 2 * float64(peakKernels[p].macs) * float64(iters)
}

// PeakRate measures p on the calling thread alone: operations per second
// (2 a multiply-add), the best of a few runs of about 20 ms by the wall
// clock; ok is false where p is not Available.
func PeakRate(p Peak) (opsPerSec float64, ok bool) {
	if !p.Available() {
		return 0, false
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	iters := 1 << 12
	for {
		t := time.Now()
		PeakOps(p, iters)
		if d := time.Since(t); d >= 2*time.Millisecond || iters >= 1<<30 {
			iters = max(1, int(float64(iters)*float64(20*time.Millisecond)/float64(max(d, time.Microsecond))))
			break
		}
		iters *= 4
	}
	for range 3 {
		t := time.Now()
		ops := PeakOps(p, iters)
		opsPerSec = max(opsPerSec, ops/time.Since(t).Seconds())
	}
	return opsPerSec, true
}

// PrefillPeak returns the Peak of the instruction that the kernel set
// named set (ISA's value) and the quantized kernels named quant
// (QuantKernels') multiply with in a product of several activation rows
// with dt weights; ok is false for the pure-Go kernels, which have none.
func PrefillPeak(set, quant string, dt DType) (p Peak, ok bool) {
	if dt.Quantized() {
		switch quant {
		case "amx":
			return PeakAMXInt8, true
		case "avx512vnni":
			return PeakVNNI, true
		case "avx2":
			return PeakInt8AVX2, true
		}
		return 0, false
	}
	switch set {
	case "amxbf16":
		if dt == BF16 {
			return PeakAMXBF16, true
		}
		return PeakFMA512, true
	case "avx512bf16":
		if dt == BF16 {
			return PeakBF16Dot, true
		}
		return PeakFMA512, true
	case "avx512":
		return PeakFMA512, true
	case "avx2":
		return PeakFMA256, true
	}
	return 0, false
}
