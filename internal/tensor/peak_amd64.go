package tensor

import "golang.org/x/sys/cpu"

// peakKernels are the peak loops (asmgen's peak.go) behind the CPUID
// checks of the kernel sets that use their instructions (kernels_amd64.go);
// run is nil for those this CPU cannot run.
var peakKernels = func() [numPeaks]peakKernel {
	x := cpu.X86
	avx2 := x.HasAVX2 && x.HasFMA && x.HasF16C && x.HasOSXSAVE
	avx512 := avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL && x.HasBMI2
	var ks [numPeaks]peakKernel
	// Accumulators times lanes times multiply-adds a lane: asmgen's
	// peakAccs is 12, peakInt8AVX2Accs 8.
	ks[PeakFMA256].macs = 12 * 8
	ks[PeakFMA512].macs = 12 * 16
	ks[PeakBF16Dot].macs = 12 * 16 * 2
	ks[PeakVNNI].macs = 12 * 16 * 4
	ks[PeakInt8AVX2].macs = 8 * 8 * 4
	if avx2 {
		ks[PeakFMA256].run = peakSum(peakFMAAVX2)
		ks[PeakInt8AVX2].run = peakSum(peakInt8AVX2)
	}
	if avx512 {
		ks[PeakFMA512].run = peakSum(peakFMAAVX512)
	}
	if avx512 && x.HasAVX512BF16 {
		ks[PeakBF16Dot].run = peakSum(peakDPBF16)
	}
	if avx512 && x.HasAVX512VNNI {
		ks[PeakVNNI].run = peakSum(peakVNNI)
	}
	// Four tiles of 16×16 outputs: 32 bf16 or 64 int8 multiply-adds each.
	ks[PeakAMXBF16].macs = 4 * 256 * 32
	ks[PeakAMXInt8].macs = 4 * 256 * 64
	if avx512 && amxBF16Available() {
		ks[PeakAMXBF16].run = peakAMXSum(peakAMXBF16, 0x3f80)
	}
	if avx512 && amxAvailable() {
		ks[PeakAMXInt8].run = peakAMXSum(peakAMXInt8, 0x0101)
	}
	return ks
}()

// peakAMXSum wraps an AMX peak kernel as peakSum does, its tiles of ones
// filled with the 16-bit pattern one (bf16 1.0, or two int8 1s).
func peakAMXSum[T float32 | int32](k func(iters int, out *T, cfg, ones, scratch *byte), one uint16) func(int) float64 {
	return peakSum(func(iters int, out *T) {
		var ones [1024]byte
		for i := 0; i < len(ones); i += 2 {
			ones[i], ones[i+1] = byte(one), byte(one>>8)
		}
		scratch := make([]byte, 4096)
		k(iters, out, &amxFullConfig[0], &ones[0], &scratch[0])
	})
}

// peakSum wraps a peak kernel storing its 16 lanes' sums (f32 or int32):
// the lanes' total.
func peakSum[T float32 | int32](k func(iters int, out *T)) func(int) float64 {
	return func(iters int) float64 {
		var out [16]T
		k(iters, &out[0])
		s := 0.0
		for _, v := range out {
			s += float64(v)
		}
		return s
	}
}
