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
		ks[PeakFMA256].run = peakF32(peakFMAAVX2)
		ks[PeakInt8AVX2].run = peakI32(peakInt8AVX2)
	}
	if avx512 {
		ks[PeakFMA512].run = peakF32(peakFMAAVX512)
	}
	if avx512 && x.HasAVX512BF16 {
		ks[PeakBF16Dot].run = peakF32(peakDPBF16)
	}
	if avx512 && x.HasAVX512VNNI {
		ks[PeakVNNI].run = peakI32(peakVNNI)
	}
	return ks
}()

// peakF32 wraps a peak kernel storing f32 lane sums: the lanes' total.
func peakF32(k func(iters int, out *float32)) func(int) float64 {
	return func(iters int) float64 {
		var out [16]float32
		k(iters, &out[0])
		s := 0.0
		for _, v := range out {
			s += float64(v)
		}
		return s
	}
}

// peakI32 wraps a peak kernel storing int32 lane sums: the lanes' total.
func peakI32(k func(iters int, out *int32)) func(int) float64 {
	return func(iters int) float64 {
		var out [16]int32
		k(iters, &out[0])
		s := 0.0
		for _, v := range out {
			s += float64(v)
		}
		return s
	}
}
