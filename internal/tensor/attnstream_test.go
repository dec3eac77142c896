package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// streamISA selects an ISA whose bf16 attention kernels prefetch a
// KVStream for the rest of the test, or skips it.
func streamISA(t testing.TB) { isaWith(t, AttnStreamBF16, "the bf16 decode kernels' KV stream") }

// testStreams returns KVStreams for the tests over the n bytes of pool:
// none, one run of all of it, runs of a line, runs of odd lengths that end
// mid-line, and runs far from anything allocated (prefetches never fault).
func testStreams(pool []uint16) map[string]*KVStream {
	bytes := 2 * len(pool)
	ss := map[string]*KVStream{"none": {}, "one run": {}, "lines": {}, "odd runs": {}, "far": {}}
	ss["one run"].Add(pool, bytes)
	for off := 0; off+32 <= len(pool); off += 32 {
		ss["lines"].Add(pool[off:], 64)
	}
	for off, k := 0, 1; off+k <= len(pool); off, k = off+k, k+7 {
		ss["odd runs"].Add(pool[off:], 2*k)
	}
	ss["far"].Add(pool, 1<<40)
	return ss
}

// TestDotRowsBF16StreamMatchesDotRowsBF16 checks that the stream key
// kernels give DotRowsBF16's bits for every KVStream, query row counts 1–9
// (tiles of 4 and a rest) and head dimensions that fill the 32-element
// steps, do not, and have no whole step, and that they report n·64·⌊k/32⌋
// bytes prefetched.
func TestDotRowsBF16StreamMatchesDotRowsBF16(t *testing.T) {
	streamISA(t)
	r := rand.New(rand.NewPCG(11, 12))
	for _, hd := range []int{64, 128, 32, 80, 96, 16, 40} {
		for _, nk := range []int{1, 3, 4, 5, 16, 17} {
			t.Run(fmt.Sprintf("hd %d/%d keys", hd, nk), func(t *testing.T) {
				keys, ldk := keyRows(r, nk, hd)
				const rows = 9
				q := queryRows(r, rows, hd)
				for n := 1; n <= rows; n++ {
					var bq BF16Query
					bq.Set(q, n, hd)
					want := make([]float32, n*nk)
					DotRowsBF16(want, nk, &bq, keys, ldk, nk)
					for name, s := range testStreams(keys) {
						got := make([]float32, n*nk)
						covered := DotRowsBF16Stream(got, nk, &bq, keys, ldk, nk, s)
						if w := nk * (hd / 32) * 64; covered != w {
							t.Fatalf("%d rows, %s: reported %d bytes prefetched, want %d", n, name, covered, w)
						}
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%d rows, %s: score %d = %g, DotRowsBF16 %g", n, name, i, got[i], want[i])
							}
						}
					}
				}
			})
		}
	}
}

// TestAttnPVBF16StreamMatchesAttnPVBF16 checks that the stream value
// kernel gives AttnPVBF16's bits for every KVStream, on head dimensions of
// whole 32-element blocks, a 16-element block and a masked tail, odd and
// even key counts, and row counts of one, a block of 8 and more, and that
// it reports the bytes it prefetched.
func TestAttnPVBF16StreamMatchesAttnPVBF16(t *testing.T) {
	streamISA(t)
	r := rand.New(rand.NewPCG(13, 14))
	for _, hd := range []int{64, 128, 80, 40, 16, 7} {
		for _, n := range []int{1, 2, 17, 64} {
			for _, rows := range []int{1, 3, 8, 13} {
				v, w, acc0, ldv, lda, ldw := pvOperands(r, hd, n, rows)
				offs := make([]int, n)
				for j, p := range r.Perm(n) {
					offs[j] = p * ldv
				}
				want := append([]float32(nil), acc0...)
				AttnPVBF16(want, lda, w, ldw, rows, v, offs, n, hd)
				lines := 2*(hd/32) + (hd%32)/16
				if hd%16 != 0 {
					lines++
				}
				for name, s := range testStreams(v) {
					got := append([]float32(nil), acc0...)
					covered := AttnPVBF16Stream(got, lda, w, ldw, rows, v, offs, n, hd, s)
					if wb := (rows + 7) / 8 * (n / 2) * lines * 64; covered != wb {
						t.Fatalf("hd %d n %d rows %d, %s: reported %d bytes prefetched, want %d", hd, n, rows, name, covered, wb)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("hd %d n %d rows %d, %s: acc %d = %g, AttnPVBF16 %g", hd, n, rows, name, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}
