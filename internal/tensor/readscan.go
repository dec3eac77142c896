package tensor

import (
	"slices"
	"unsafe"
)

// ReadScan returns the sum, modulo 2⁶⁴, of x's whole 64-bit words (x's
// bits read in pairs of floats; an odd last float is skipped): the
// streaming read that measures a machine's read limit (tandem bench model,
// BenchmarkStreamRead). On amd64 with AVX2 it is generated assembly that
// does nothing but one 32-byte load and one add per 32 bytes into eight
// independent accumulators, reading x as streams equal parts side by side
// (streams one of ReadScanStreams; any other count reads one), with, unless
// pf is 0, a software prefetch pf bytes ahead in each (the matrix row
// kernels prefetch 8 KiB ahead because the hardware prefetchers stop at
// 4 KiB pages); elsewhere it is a Go loop and ignores streams and pf. Time
// it at each stream count and distance and keep the fastest.
func ReadScan(x []float32, streams, pf int) uint64 {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(x))), len(x)/2)
	var s uint64
	if readScanAsm != nil {
		fn := readScanAsm[0]
		if i := slices.Index(ReadScanStreams, streams); i > 0 {
			fn = readScanAsm[i]
		} else {
			streams = 1
		}
		if n := (len(w) / streams) &^ 31; n > 0 { // words per stream: whole 256-byte steps
			s = fn((*byte)(unsafe.Pointer(&w[0])), 8*n, 8*n, max(pf, 0))
			w = w[streams*n:]
		}
	}
	for _, v := range w {
		s += v
	}
	return s
}

// ReadScanStreams are the numbers of streams ReadScan reads side by side.
var ReadScanStreams = []int{1, 2, 4, 8}

// ReadScanDistances are the prefetch distances in bytes, 0 for none, at
// which a read limit measurement times ReadScan.
var ReadScanDistances = []int{0, 2 << 10, 4 << 10, 8 << 10, 16 << 10}

// ReadScanIsAssembly reports whether ReadScan runs the assembly scan on
// this machine (otherwise it is a Go loop, below what the memory gives
// on most CPUs).
func ReadScanIsAssembly() bool { return readScanAsm != nil }

// SumWords adds x's bits as 64-bit words in eight independent chains and
// returns the sum: a plain read of x with one add per 8 bytes, the Go scan
// that measured the read limit before ReadScan, printed beside it for
// comparison. ArgMax, the scan used before that, is a Go loop without
// AVX-512 and bound by its arithmetic (~5.8 GB/s on a Zen 2). Like any
// scan without software prefetch it reads less than the prefetching matrix
// kernels reach on some cores (see docs/performance-log.md).
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
