//go:build !linux

package hugemem

// HugeBytes reports nothing here: ok is false (transparent huge pages are
// Linux's).
func HugeBytes([]byte) (int64, bool) { return 0, false }

// Mode returns "": transparent huge pages are Linux's.
func Mode() string { return "" }
