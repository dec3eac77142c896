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
	n, ok := HugeBytes(b)
	if !ok || n < 0 || n > size {
		t.Fatalf("HugeBytes = %d, %t for %d bytes mapped", n, ok, size)
	}
	t.Logf("THP %q: %d of %d bytes in huge pages", Mode(), n, size)
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

func TestHugeInSumsTheEntriesInsideTheRange(t *testing.T) {
	smaps := []byte(`7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      4096 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
7f0000600000-7f0000800000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
`)
	if got := hugeIn(smaps, 0x7f0000000000, 0x7f0000600000); got != 6<<20 {
		t.Errorf("hugeIn = %d, want %d (the two entries inside, not the third)", got, 6<<20)
	}
	if got := hugeIn(smaps, 0x7f0000100000, 0x7f0000600000); got != 2<<20 {
		t.Errorf("hugeIn = %d, want %d (an entry reaching out of the range is not counted)", got, 2<<20)
	}
}

func TestSelectedReadsTheBracketedChoice(t *testing.T) {
	for in, want := range map[string]string{"always [madvise] never\n": "madvise", "[always] madvise never": "always", "always madvise [never]": "never", "garbage": ""} {
		if got := selected(in); got != want {
			t.Errorf("selected(%q) = %q, want %q", in, got, want)
		}
	}
}
