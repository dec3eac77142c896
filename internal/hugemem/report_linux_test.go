package hugemem

import "testing"

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
