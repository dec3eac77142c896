//go:build unix

package hugemem

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Map returns size bytes (at least one) of fresh zeroed anonymous memory,
// readable and writable, starting on an Align boundary, its capacity
// rounded up to a multiple of Align; on Linux advised for transparent huge
// pages. Unmap releases it; Protect makes it read-only.
func Map(size int) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("hugemem: negative size %d", size)
	}
	n := uintptr(roundUp(max(size, 1)))
	// Over-map by Align and trim both ends, so that the pages start on a
	// huge-page boundary whatever the kernel's placement. (The pointer
	// forms: unix.Munmap releases only whole mappings it made.)
	raw, err := unix.MmapPtr(-1, 0, nil, n+Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("hugemem: map %d bytes: %w", n, err)
	}
	head := -uintptr(raw) & (Align - 1)
	start := unsafe.Add(raw, head)
	if head > 0 {
		if err := unix.MunmapPtr(raw, head); err != nil {
			_ = unix.MunmapPtr(raw, n+Align)
			return nil, fmt.Errorf("hugemem: trim a mapping: %w", err)
		}
	}
	if tail := Align - head; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(start, n), tail); err != nil {
			_ = unix.MunmapPtr(start, n+tail)
			return nil, fmt.Errorf("hugemem: trim a mapping: %w", err)
		}
	}
	mem := unsafe.Slice((*byte)(start), n)
	adviseHuge(mem)
	return mem[:size], nil
}

// Unmap releases memory that Map returned: the slice Map returned, or any
// slice of it that starts where it starts (the whole capacity is
// released). Nothing may use it afterwards.
func Unmap(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b))); err != nil {
		return fmt.Errorf("hugemem: unmap: %w", err)
	}
	return nil
}

// Protect makes memory that Map returned read-only (the whole capacity).
func Protect(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.Mprotect(b[:cap(b)], unix.PROT_READ); err != nil {
		return fmt.Errorf("hugemem: protect: %w", err)
	}
	return nil
}

// Discard releases the whole pages within b (memory Map returned, or part
// of it) to the kernel: reading them afterwards gives zeros. For memory
// whose contents moved elsewhere.
func Discard(b []byte) error {
	const page = 4096
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo, hi := (start+page-1)&^(page-1), (start+uintptr(len(b)))&^(page-1)
	if hi <= lo {
		return nil
	}
	if err := unix.Madvise(b[lo-start:hi-start], unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("hugemem: discard: %w", err)
	}
	return nil
}
