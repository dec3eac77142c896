package tensor

import "unsafe"

// SumWords adds x's bits as 64-bit words in eight independent chains and
// returns the sum. It is the reference scan for a machine's read limit
// (tandem bench model, BenchmarkStreamRead): two loads and adds per 16
// bytes, far below any memory's rate on every CPU, whereas ArgMax is a Go
// loop without AVX-512 and bound by its arithmetic (~5.8 GB/s on a Zen 2).
func SumWords(x []float32) uint64 {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(x))), len(x)/2)
	var s [8]uint64
	for i := 0; i+8 <= len(w); i += 8 {
		s[0] += w[i]
		s[1] += w[i+1]
		s[2] += w[i+2]
		s[3] += w[i+3]
		s[4] += w[i+4]
		s[5] += w[i+5]
		s[6] += w[i+6]
		s[7] += w[i+7]
	}
	return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]
}
