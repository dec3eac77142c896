package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestReadScanAddsEveryWholeWord checks ReadScan against a plain sum of
// the 64-bit words, at every prefetch distance, on lengths around the
// assembly's 256-byte steps, at unaligned starts, and with sums that wrap.
func TestReadScanAddsEveryWholeWord(t *testing.T) {
	if !ReadScanIsAssembly() {
		t.Log("no assembly scan on this machine: testing the Go loop")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	big := make([]float32, 1<<16+200)
	for i := range big {
		big[i] = math.Float32frombits(rng.Uint32()) // all bits, so the sums wrap
	}
	var lens []int
	for n := range 260 {
		lens = append(lens, n)
	}
	lens = append(lens, 511, 512, 513, 4095, 4096, 4097, 8*64-1, 8*64+2, 1<<16)
	for _, pf := range append([]int{-1}, ReadScanDistances...) {
		for _, streams := range append([]int{3}, ReadScanStreams...) {
			for _, start := range []int{0, 1, 3} {
				for _, n := range lens {
					x := big[start : start+n]
					var want uint64
					for i := 0; i+1 < len(x); i += 2 {
						want += uint64(math.Float32bits(x[i])) | uint64(math.Float32bits(x[i+1]))<<32
					}
					if got := ReadScan(x, streams, pf); got != want {
						t.Fatalf("ReadScan(x[%d:%d], %d streams, pf %d) = %#x, want %#x", start, start+n, streams, pf, got, want)
					}
				}
			}
		}
	}
}
