package tensor

import "unsafe"

// PrefetchRowsU16 asks the CPU to bring rows rows of n elements, spaced ld
// apart, from the start of v into the cache, without waiting for them: the
// next block of a paged KV cache, while the current one is computed on. It
// is only a hint (a no-op where there is no prefetch kernel) and never
// reads beyond v.
func PrefetchRowsU16(v []uint16, ld, rows, n int) {
	if len(v) > 0 {
		prefetchElems(unsafe.Pointer(&v[0]), 2, len(v), ld, rows, n)
	}
}

// PrefetchRowsF32 is PrefetchRowsU16 for float32 rows.
func PrefetchRowsF32(v []float32, ld, rows, n int) {
	if len(v) > 0 {
		prefetchElems(unsafe.Pointer(&v[0]), 4, len(v), ld, rows, n)
	}
}

// prefetchElems prefetches rows rows of n elements of size bytes, ld
// elements apart, of the length-elements slice at p.
func prefetchElems(p unsafe.Pointer, size, length, ld, rows, n int) {
	if rows <= 0 || n <= 0 {
		return
	}
	rows = min(rows, (length-1)/max(ld, 1)+1)
	// A row of size·n bytes touches at most (size·n-2)/64+2 lines at any
	// alignment.
	prefetch(uintptr(p), size*ld, rows, (size*n-2)/64+2)
}
