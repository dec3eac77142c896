//go:build !linux

package hugemem

// Resident reports nothing here: ok is false (smaps is Linux's).
func Resident([]byte) (rss, huge int64, ok bool) { return 0, 0, false }

// Mode returns "": transparent huge pages are Linux's.
func Mode() string { return "" }
