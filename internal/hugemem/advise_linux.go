package hugemem

import "golang.org/x/sys/unix"

// adviseHuge asks for transparent huge pages. The advice is a hint: where
// THP is off it does nothing, and an error (a kernel without THP) changes
// nothing Map promises, so it is ignored.
func adviseHuge(mem []byte) { _ = unix.Madvise(mem, unix.MADV_HUGEPAGE) }
