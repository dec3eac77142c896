package hugemem

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

// TestMapAdvisesHugePages: the mapping carries the huge-page advice (its
// smaps VmFlags has "hg"), whatever the kernel could give it; what it gave
// is logged (none where THP is "never", or memory is too fragmented for a
// 2 MiB page), and never more than was mapped.
func TestMapAdvisesHugePages(t *testing.T) {
	if Mode() == "" {
		t.Skip("this kernel has no transparent huge pages")
	}
	const size = 8 * Align
	b, err := Map(size)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	for i := 0; i < size; i += 4096 {
		b[i] = 1
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	flags, ok := vmFlags(smaps, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))))
	if !ok {
		t.Fatal("no smaps entry holds the mapping")
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("the mapping's VmFlags %q lack hg (MADV_HUGEPAGE)", flags)
	}
	rss, n, ok := Resident(b)
	if !ok || n < 0 || n > rss || rss != size {
		t.Fatalf("Resident = %d, %d, %t for %d bytes mapped and touched", rss, n, ok, size)
	}
	t.Logf("THP %q: %d of %d bytes in huge pages", Mode(), n, size)
	if err := Discard(b[4096 : size-4096]); err != nil {
		t.Fatal(err)
	}
	if rss, _, _ := Resident(b); rss != 2*4096 {
		t.Errorf("after discarding all but a page at each end: %d bytes resident, want %d", rss, 2*4096)
	}
}

// vmFlags returns the VmFlags of the smaps entry holding address p.
func vmFlags(smaps []byte, p uint64) (string, bool) {
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if c, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); c == 2 {
			in = lo <= p && p < hi
			continue
		}
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok && in {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

func TestPagesInSumsTheEntriesInsideTheRange(t *testing.T) {
	smaps := []byte(`7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
Rss:                4096 kB
AnonHugePages:      4096 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Rss:                2048 kB
AnonHugePages:      2048 kB
7f0000600000-7f0000800000 rw-p 00000000 00:00 0
Rss:                 100 kB
AnonHugePages:         0 kB
`)
	if rss, huge := pagesIn(smaps, 0x7f0000000000, 0x7f0000600000); rss != 6<<20 || huge != 6<<20 {
		t.Errorf("pagesIn = %d, %d, want %d, %d (the two entries inside, not the third)", rss, huge, 6<<20, 6<<20)
	}
	if rss, huge := pagesIn(smaps, 0x7f0000100000, 0x7f0000800000); rss != 2148<<10 || huge != 2<<20 {
		t.Errorf("pagesIn = %d, %d, want %d, %d (an entry reaching out of the range is not counted)", rss, huge, 2148<<10, 2<<20)
	}
}

func TestSelectedReadsTheBracketedChoice(t *testing.T) {
	for in, want := range map[string]string{"always [madvise] never\n": "madvise", "[always] madvise never": "always", "always madvise [never]": "never", "garbage": ""} {
		if got := selected(in); got != want {
			t.Errorf("selected(%q) = %q, want %q", in, got, want)
		}
	}
}
