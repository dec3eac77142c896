package tensor

import "unsafe"

// PrefetchRowsU16 asks the CPU to bring rows rows of n elements, spaced ld
// apart, from the start of v into the cache, without waiting for them: the
// next block of a paged KV cache, while the current one is computed on. It
// is only a hint (a no-op where there is no prefetch kernel) and never
// reads beyond v.
func PrefetchRowsU16(v []uint16, ld, rows, n int) {
	if rows <= 0 || n <= 0 || len(v) == 0 {
		return
	}
	rows = min(rows, (len(v)-1)/max(ld, 1)+1)
	// A row of 2n bytes touches at most (2n-2)/64+2 lines at any alignment.
	prefetch(uintptr(unsafe.Pointer(&v[0])), 2*ld, rows, (2*n-2)/64+2)
}

// PrefetchRowsF32 is PrefetchRowsU16 for float32 rows.
func PrefetchRowsF32(v []float32, ld, rows, n int) {
	if rows <= 0 || n <= 0 || len(v) == 0 {
		return
	}
	rows = min(rows, (len(v)-1)/max(ld, 1)+1)
	prefetch(uintptr(unsafe.Pointer(&v[0])), 4*ld, rows, (4*n-2)/64+2)
}
