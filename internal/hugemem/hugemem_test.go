package hugemem

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

func TestMapIsAlignedZeroedAndWritable(t *testing.T) {
	for _, size := range []int{0, 1, 4096, Align - 1, Align, Align + 1, 5*Align + 123} {
		b, err := Map(size)
		if err != nil {
			t.Fatalf("Map(%d): %v", size, err)
		}
		if len(b) != size {
			t.Errorf("Map(%d): len %d", size, len(b))
		}
		if c := cap(b); c%Align != 0 || c < max(size, 1) || c >= max(size, 1)+Align {
			t.Errorf("Map(%d): cap %d, want the next multiple of %d", size, c, Align)
		}
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(b))); p%Align != 0 {
			t.Errorf("Map(%d): starts at %#x, not %d-aligned", size, p, Align)
		}
		if lo, hi, ok := mappingOf(b); ok && (lo != uintptr(unsafe.Pointer(unsafe.SliceData(b))) || hi-lo != uintptr(cap(b))) {
			t.Errorf("Map(%d): the mapping is %#x-%#x, want exactly the %d bytes from %p", size, lo, hi, cap(b), unsafe.SliceData(b))
		}
		full := b[:cap(b)]
		for i := 0; i < len(full); i += 4096 {
			if full[i] != 0 {
				t.Fatalf("Map(%d): byte %d is %d, not zero", size, i, full[i])
			}
			full[i] = 1
		}
		if err := Unmap(b); err != nil {
			t.Errorf("Unmap after Map(%d): %v", size, err)
		}
	}
	if _, err := Map(-1); err == nil {
		t.Error("Map(-1) succeeded")
	}
}

// Unmapping one mapping leaves one made after it whole.
func TestUnmapReleasesOnlyItsOwnPages(t *testing.T) {
	a, err := Map(3 * Align)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Map(Align)
	if err != nil {
		t.Fatal(err)
	}
	if err := Unmap(a); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = byte(i)
	}
	if err := Unmap(b); err != nil {
		t.Fatal(err)
	}
}

// mappingOf returns the bounds of the /proc/self/smaps entry holding b
// (Linux only: ok is false elsewhere). Map's mapping is its own entry as
// long as its neighbours differ in protection or advice, which holds for
// the trimmed ends of the over-map being gone.
func mappingOf(b []byte) (lo, hi uintptr, ok bool) {
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, 0, false
	}
	p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	for _, line := range strings.Split(string(smaps), "\n") {
		var l, h uint64
		if n, _ := fmt.Sscanf(line, "%x-%x", &l, &h); n == 2 && l <= p && p < h {
			return uintptr(l), uintptr(h), true
		}
	}
	return 0, 0, false
}
