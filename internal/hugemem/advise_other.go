//go:build unix && !linux

package hugemem

// adviseHuge does nothing: huge pages for anonymous memory are Linux's
// MADV_HUGEPAGE here.
func adviseHuge([]byte) {}
