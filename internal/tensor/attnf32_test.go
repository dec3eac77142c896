package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// packedF32ISA selects an ISA with the packed-key f32 scores kernel for the
// rest of the test, or skips it.
func packedF32ISA(t testing.TB) { isaWith(t, AttnPackedF32, "the packed-key f32 scores kernel") }

// isaWith selects the first ISA on which has reports true for the rest of
// the test (restoring the default after), or skips the test naming what.
func isaWith(t testing.TB, has func() bool, what string) {
	t.Helper()
	def := ISA()
	t.Cleanup(func() { _ = SetISA(def) })
	for _, isa := range ISAs() {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		if has() {
			return
		}
	}
	t.Skipf("no ISA with %s on this CPU", what)
}

// TestAttnScoresF32MatchDotRows checks that scoring keys packed transposed
// gives the bits DotRowsBF16 gives over the bf16 keys and DotRows over the
// same keys in f32, for head dimensions that are multiples of 8 and not
// (the scalar tail), below 8, every row count modulo the kernels' 3, key
// counts that cut a group or a pair, subnormals, signed zeros,
// underflowing products and large finite values.
func TestAttnScoresF32MatchDotRows(t *testing.T) {
	packedF32ISA(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, hd := range []int{64, 128, 1, 3, 7, 8, 9, 15, 16, 17, 40, 63, 80, 96, 130, 256} {
		for _, nk := range []int{1, 7, 8, 9, 16, 17, 33, 64} {
			t.Run(fmt.Sprintf("hd %d/%d keys", hd, nk), func(t *testing.T) {
				big := float32(math.Sqrt(1e37 / float64(hd)))
				ldk := hd + 5
				keys := make([]uint16, nk*ldk)
				keysF := make([]float32, nk*ldk)
				for i := range keys {
					keys[i] = extremeBF16(r, big)
					keysF[i] = BF16ToF32(keys[i])
				}
				pairs := (nk + 15) / 16
				packedB := make([]float32, PackedKeysF32Len(nk, hd))
				packedF := make([]float32, len(packedB))
				for i := range packedB {
					packedB[i] = float32(math.NaN()) // every element must be written
					packedF[i] = float32(math.NaN())
				}
				// In two calls, as a paged pool's blocks would be packed.
				cut := min(5, nk)
				PackKeysF32FromBF16(packedB, 0, keys, ldk, cut, hd)
				PackKeysF32FromBF16(packedB, cut, keys[cut*ldk:], ldk, nk-cut, hd)
				PackKeysF32FromBF16(packedB, nk, nil, 0, pairs*16-nk, hd)
				PackKeysF32(packedF, 0, keysF, ldk, cut, hd)
				PackKeysF32(packedF, cut, keysF[cut*ldk:], ldk, nk-cut, hd)
				PackKeysF32(packedF, nk, nil, 0, pairs*16-nk, hd)
				const rows = 8
				ldq := hd + 2
				q := make([]float32, rows*ldq)
				for i := range q {
					q[i] = BF16ToF32(extremeBF16(r, big))
					if i%3 == 0 {
						q[i] = float32(r.NormFloat64()) // not a bf16 value
					}
				}
				qc := make([]float32, rows*hd)
				for i := range rows {
					copy(qc[i*hd:(i+1)*hd], q[i*ldq:])
				}
				var bq BF16Query
				bq.Set(qc, rows, hd)
				ldo := 16*pairs + 3
				want := make([]float32, rows*ldo)
				DotRowsBF16(want, ldo, &bq, keys, ldk, nk)
				for n := 1; n <= rows; n++ {
					for _, packed := range [][]float32{packedB, packedF} {
						got := make([]float32, rows*ldo)
						AttnScoresF32(got, ldo, q, ldq, n, packed, pairs, hd)
						for i := range n {
							for j := range nk {
								g, w := got[i*ldo+j], want[i*ldo+j]
								if math.Float32bits(g) != math.Float32bits(w) {
									t.Fatalf("%d rows: score (%d, %d) = %g (%#x), DotRowsBF16 %g (%#x)", n, i, j, g, math.Float32bits(g), w, math.Float32bits(w))
								}
							}
							for j := nk; j < 16*pairs; j++ {
								if g := got[i*ldo+j]; g != 0 && !math.IsNaN(float64(g)) && !math.IsInf(float64(g), 0) {
									t.Fatalf("%d rows: padding key %d scored %g, want 0 (zero key)", n, j, g)
								}
							}
						}
					}
					// DotRows over the f32 keys: the same bits again.
					for i := range n {
						row := make([]float32, nk)
						DotRows(row, qc[i*hd:(i+1)*hd], keysF, ldk)
						for j, w := range row {
							if math.Float32bits(w) != math.Float32bits(want[i*ldo+j]) {
								t.Fatalf("DotRows score (%d, %d) = %g, DotRowsBF16 %g", i, j, w, want[i*ldo+j])
							}
						}
					}
				}
			})
		}
	}
}

// TestAttnScoresF32PanicsOnShortOperands checks the bounds checks of the
// packed-key calls.
func TestAttnScoresF32PanicsOnShortOperands(t *testing.T) {
	packedF32ISA(t)
	const hd = 16
	keys := make([]float32, PackedKeysF32Len(16, hd))
	q := make([]float32, 2*hd)
	out := make([]float32, 2*16)
	for name, f := range map[string]func(){
		"short keys":  func() { AttnScoresF32(out, 16, q, hd, 2, keys[:len(keys)-1], 1, hd) },
		"short query": func() { AttnScoresF32(out, 16, q[:2*hd-1], hd, 2, keys, 1, hd) },
		"short out":   func() { AttnScoresF32(out[:31], 16, q, hd, 2, keys, 1, hd) },
		"narrow ldo":  func() { AttnScoresF32(out, 15, q, hd, 2, keys, 1, hd) },
		"pack past":   func() { PackKeysF32(keys, 10, make([]float32, 7*hd), hd, 7, hd) },
		"pack short":  func() { PackKeysF32FromBF16(keys, 0, make([]uint16, hd-1), hd, 1, hd) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkAttnScoresF32 compares, for one chunk of 64 keys and 48 query
// rows (a 16-token tile of a 3-head GQA group), DotRowsBF16 over the pool's
// rows with AttnScoresF32 over the packed keys.
func BenchmarkAttnScoresF32(b *testing.B) {
	packedF32ISA(b)
	r := rand.New(rand.NewPCG(1, 2))
	for _, hd := range []int{64, 128} {
		const rows, nk, kvd = 48, 64, 192
		keys := make([]uint16, nk*kvd)
		for i := range keys {
			keys[i] = F32ToBF16(float32(r.NormFloat64()))
		}
		packed := make([]float32, PackedKeysF32Len(nk, hd))
		PackKeysF32FromBF16(packed, 0, keys, kvd, nk, hd)
		q := make([]float32, rows*hd)
		for i := range q {
			q[i] = float32(r.NormFloat64())
		}
		var bq BF16Query
		bq.Set(q, rows, hd)
		out := make([]float32, rows*nk)
		flops := float64(2 * rows * nk * hd)
		b.Run(fmt.Sprintf("hd=%d/DotRowsBF16", hd), func(b *testing.B) {
			for b.Loop() {
				DotRowsBF16(out, nk, &bq, keys, kvd, nk)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("hd=%d/packed", hd), func(b *testing.B) {
			for b.Loop() {
				AttnScoresF32(out, nk, q, hd, rows, packed, nk/16, hd)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
