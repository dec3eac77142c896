package tensor

import "unsafe"

// SumWords adds x's bits as 64-bit words in eight independent chains and
// returns the sum: a plain read of x with one add per 8 bytes, the scan
// that measures a machine's read limit (tandem bench model,
// BenchmarkStreamRead). ArgMax, the scan used before, is a Go loop without
// AVX-512 and bound by its arithmetic (~5.8 GB/s on a Zen 2). Like any scan
// without software prefetch it reads less than the prefetching matrix
// kernels reach on some cores (see docs/performance.md).
func SumWords(x []float32) uint64 {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(x))), len(x)/2)
	// Eight scalars, not an array: Go keeps only scalars in registers.
	var s0, s1, s2, s3, s4, s5, s6, s7 uint64
	for len(w) >= 8 {
		s0 += w[0]
		s1 += w[1]
		s2 += w[2]
		s3 += w[3]
		s4 += w[4]
		s5 += w[5]
		s6 += w[6]
		s7 += w[7]
		w = w[8:]
	}
	return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
}
