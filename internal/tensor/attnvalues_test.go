package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// attnPrefetchDistances are prefetch distances in bytes for the tests: none,
// the rows just read, the next rows, a later block, behind, and far from
// anything allocated (prefetches never fault).
var attnPrefetchDistances = []int{0, 64, 8 << 10, 1 << 20, -4096, 1 << 40}

// TestAttnKeyScoresPrefetchChangesNothing checks that the scores kernels
// give the same bits with any prefetch distance as DotRowsBF16, for row
// counts 1–4 and head dimensions whose step loop runs whole 4-step trips
// (the prefetching ones), trips and single steps, and single steps only,
// and that they report the bytes they prefetched: 64·8·⌊hd/32⌋ a whole
// group of 8 keys where the kernels run, none where DotRowsBF16 does.
func TestAttnKeyScoresPrefetchChangesNothing(t *testing.T) {
	keyScoresISA(t)
	r := rand.New(rand.NewPCG(9, 10))
	for _, hd := range []int{64, 128, 32, 40, 96, 8, 24, 12} {
		for _, nk := range []int{5, 8, 16, 17, 64} {
			t.Run(fmt.Sprintf("hd %d/%d keys", hd, nk), func(t *testing.T) {
				keys, ldk := keyRows(r, nk, hd)
				const rows = 4
				q := queryRows(r, rows, hd)
				for n := 1; n <= rows; n++ {
					var bq BF16Query
					bq.Set(q, n, hd)
					want := make([]float32, n*nk)
					DotRowsBF16(want, nk, &bq, keys, ldk, nk)
					wantBytes := nk / 8 * 8 * (hd / 32) * 64
					if hd%8 != 0 || nk < 8 {
						wantBytes = 0
					}
					for _, pf := range attnPrefetchDistances {
						got := make([]float32, n*nk)
						covered := AttnKeyScoresBF16Prefetch(got, nk, &bq, keys, ldk, nk, pf)
						if covered != wantBytes {
							t.Fatalf("%d rows, pf %d: reported %d bytes prefetched, want %d", n, pf, covered, wantBytes)
						}
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%d rows, pf %d: score %d = %g, DotRowsBF16 %g", n, pf, i, got[i], want[i])
							}
						}
					}
				}
			})
		}
	}
}

// TestAttnValuesMatchAxpyRowsBF16Group checks that AttnValuesBF16 gives
// AxpyRowsBF16Group's bits with any prefetch distance, for every group
// size the kernels take (2–4) and those they do not (1, 5), lengths that
// are multiples of 32 and not, and row counts of one, a block and more,
// and that it reports the bytes it prefetched: as many as it reads where
// a kernel runs (AttnDecodePrefetch, 2 ≤ g ≤ 4, n a multiple of 32), else
// none.
func TestAttnValuesMatchAxpyRowsBF16Group(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(12, 12))
		for _, g := range []int{1, 2, 3, 4, 5} {
			for _, n := range []int{32, 64, 128, 16, 40, 65} {
				for _, rows := range []int{1, 5, 16, 33} {
					ldv, ldy, lda := n+16, n+1, rows+2
					v := make([]uint16, rows*ldv)
					big := float32(math.Sqrt(1e37 / float64(rows)))
					for i := range v {
						v[i] = extremeBF16(rng, big)
					}
					alpha := randVec(rng, g*lda)
					y0 := randVec(rng, g*ldy)
					want := append([]float32(nil), y0...)
					AxpyRowsBF16Group(g, n, want, ldy, alpha, lda, rows, v, ldv)
					wantBytes := 0
					if AttnDecodePrefetch() && g >= 2 && g <= 4 && n%32 == 0 {
						wantBytes = rows * n * 2
					}
					for _, pf := range attnPrefetchDistances {
						got := append([]float32(nil), y0...)
						if covered := AttnValuesBF16(g, n, got, ldy, alpha, lda, rows, v, ldv, pf); covered != wantBytes {
							t.Fatalf("g=%d n=%d rows=%d pf=%d: reported %d bytes prefetched, want %d", g, n, rows, pf, covered, wantBytes)
						}
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("g=%d n=%d rows=%d pf=%d: y[%d] = %g, AxpyRowsBF16Group %g", g, n, rows, pf, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	})
}
