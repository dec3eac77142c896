package hugemem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// Resident returns how many bytes of the memory Map returned as b (its
// whole capacity) are resident now and how many of those the kernel holds
// in transparent huge pages, from /proc/self/smaps; ok is false where that
// cannot be read.
func Resident(b []byte) (rss, huge int64, ok bool) {
	if cap(b) == 0 {
		return 0, 0, true
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, 0, false
	}
	lo := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	hi := lo + uint64(cap(b))
	rss, huge = pagesIn(smaps, lo, hi)
	return rss, huge, true
}

// pagesIn sums the Rss and AnonHugePages of the smaps entries that lie
// within [lo, hi).
func pagesIn(smaps []byte, lo, hi uint64) (rss, huge int64) {
	in := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Text()
		var start, end uint64
		if c, _ := fmt.Sscanf(line, "%x-%x ", &start, &end); c == 2 {
			in = start >= lo && end <= hi
			continue
		}
		if !in {
			continue
		}
		for _, f := range []struct {
			key string
			sum *int64
		}{{"Rss:", &rss}, {"AnonHugePages:", &huge}} {
			if rest, found := strings.CutPrefix(line, f.key); found {
				var kb int64
				if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
					*f.sum += kb << 10
				}
			}
		}
	}
	return rss, huge
}

// Mode returns the system's transparent huge page policy for anonymous
// memory ("always", "madvise" or "never"), "" where it cannot be read.
func Mode() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	return selected(string(b))
}

// selected returns the bracketed word of a sysfs choice list ("always
// [madvise] never" → "madvise"), "" if none is.
func selected(s string) string {
	for _, w := range strings.Fields(s) {
		if strings.HasPrefix(w, "[") && strings.HasSuffix(w, "]") {
			return strings.Trim(w, "[]")
		}
	}
	return ""
}
