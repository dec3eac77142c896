//go:build !unix

package hugemem

import (
	"fmt"
	"unsafe"
)

// Map returns size bytes (at least one) of zeroed memory from the Go heap,
// starting on an Align boundary, its capacity rounded up to a multiple of
// Align (no huge pages: this platform has no MADV_HUGEPAGE).
func Map(size int) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("hugemem: negative size %d", size)
	}
	n := roundUp(max(size, 1))
	raw := make([]byte, n+Align)
	head := int(-uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & (Align - 1))
	return raw[head : head+size : head+n], nil
}

// Unmap does nothing here: the garbage collector frees Map's memory.
func Unmap([]byte) error { return nil }

// Protect does nothing here: the Go heap cannot be made read-only.
func Protect([]byte) error { return nil }

// Discard does nothing here: the Go heap's pages cannot be released.
func Discard([]byte) error { return nil }
