package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// keyScoresISA selects an ISA with the 8-keys-a-vector decode scores
// kernels (AttnKeyScores) for the test, or skips it.
func keyScoresISA(t testing.TB) { isaWith(t, AttnKeyScores, "the decode key-scores kernels") }

// TestAttnKeyScoresMatchDotRowsBF16 checks that scoring key rows 8 at a
// time gives the bits DotRowsBF16 (the matmul kernels, one reduction per
// score) gives, for every row count 1–8 (the kernels take 1–3 rows a
// call), key counts that fill groups of 8 and cut one, head dimensions
// that are multiples of 8 and not (those fall back to DotRowsBF16), strides
// wider than a row, and data with subnormals, signed zeros, underflowing
// products and large finite values. The data are checked to tell the
// pinned order from others (TestAttnKeyScoresDataDetectReordering).
func TestAttnKeyScoresMatchDotRowsBF16(t *testing.T) {
	keyScoresISA(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, hd := range []int{64, 128, 8, 16, 24, 40, 96, 256, 1, 7, 9, 65} {
		for _, nk := range []int{1, 7, 8, 9, 15, 16, 17, 24, 31, 64} {
			t.Run(fmt.Sprintf("hd %d/%d keys", hd, nk), func(t *testing.T) {
				keys, ldk := keyRows(r, nk, hd)
				const rows = 8
				q := queryRows(r, rows, hd)
				ldo := nk + 3
				for n := 1; n <= rows; n++ {
					var bq BF16Query
					bq.Set(q, n, hd)
					want := make([]float32, n*ldo)
					got := make([]float32, n*ldo)
					for i := range got {
						got[i] = float32(math.NaN()) // every score must be written
					}
					DotRowsBF16(want, ldo, &bq, keys, ldk, nk)
					AttnKeyScoresBF16(got, ldo, &bq, keys, ldk, nk)
					for i := range n {
						for j := range nk {
							g, w := got[i*ldo+j], want[i*ldo+j]
							if math.Float32bits(g) != math.Float32bits(w) {
								t.Fatalf("%d rows: score (%d, %d) = %g (%#x), DotRowsBF16 %g (%#x)", n, i, j, g, math.Float32bits(g), w, math.Float32bits(w))
							}
						}
						for j := nk; j < ldo && i < n-1; j++ {
							if g := got[i*ldo+j]; !math.IsNaN(float64(g)) {
								t.Fatalf("%d rows: wrote %g past the keys at (%d, %d)", n, g, i, j)
							}
						}
					}
				}
			})
		}
	}
}

// TestAttnKeyScoresDataDetectReordering checks that the data of
// TestAttnKeyScoresMatchDotRowsBF16 would catch a kernel that reordered a
// score's operations: a model of the pinned order in Go (lane l's FMA chain
// over elements l, l+8, ..., then ((L0+L4)+(L2+L6)) + ((L1+L5)+(L3+L7)))
// reproduces DotRowsBF16 and AttnKeyScoresBF16 bit for bit, while models
// of other orders (another lane tree; the chains summed lane by lane; one
// sequential chain) each differ from them in at least 5% of the scores.
func TestAttnKeyScoresDataDetectReordering(t *testing.T) {
	keyScoresISA(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, hd := range []int{64, 128} {
		const nk, rows = 64, 3
		keys, ldk := keyRows(r, nk, hd)
		q := queryRows(r, rows, hd)
		var bq BF16Query
		bq.Set(q, rows, hd)
		got := make([]float32, rows*nk)
		AttnKeyScoresBF16(got, nk, &bq, keys, ldk, nk)
		trees := map[string]func(l [8]float32) float32{
			"pinned":     func(l [8]float32) float32 { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])) },
			"adjacent":   func(l [8]float32) float32 { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])) },
			"lane order": func(l [8]float32) float32 { return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7] },
		}
		differ := map[string]int{}
		for i := range rows {
			for j := range nk {
				k := keys[j*ldk:][:hd]
				var lanes [8]float32
				var seq float32
				for e := range hd {
					lanes[e%8] = fma32(q[i*hd+e], BF16ToF32(k[e]), lanes[e%8])
					seq = fma32(q[i*hd+e], BF16ToF32(k[e]), seq)
				}
				g := math.Float32bits(got[i*nk+j])
				for name, tree := range trees {
					if math.Float32bits(tree(lanes)) != g {
						differ[name]++
					}
				}
				if math.Float32bits(seq) != g {
					differ["one chain"]++
				}
			}
		}
		if differ["pinned"] != 0 {
			t.Fatalf("hd %d: the model of the pinned order differs from the kernels in %d of %d scores", hd, differ["pinned"], rows*nk)
		}
		for _, name := range []string{"adjacent", "lane order", "one chain"} {
			if differ[name] < rows*nk/20 {
				t.Errorf("hd %d: order %q differs in only %d of %d scores: the data would not catch it", hd, name, differ[name], rows*nk)
			}
		}
	}
}

// keyRows returns nk random bf16 key rows of hd elements (extremeBF16's
// mix) and their stride, wider than a row.
func keyRows(r *rand.Rand, nk, hd int) ([]uint16, int) {
	big := float32(math.Sqrt(1e37 / float64(hd)))
	ldk := hd + 5
	keys := make([]uint16, nk*ldk)
	for i := range keys {
		keys[i] = extremeBF16(r, big)
	}
	return keys, ldk
}

// queryRows returns rows f32 query rows of hd elements: bf16 values of
// extremeBF16's mix and, every third element, values bf16 cannot hold.
func queryRows(r *rand.Rand, rows, hd int) []float32 {
	big := float32(math.Sqrt(1e37 / float64(hd)))
	q := make([]float32, rows*hd)
	for i := range q {
		q[i] = BF16ToF32(extremeBF16(r, big))
		if i%3 == 0 {
			q[i] = float32(r.NormFloat64())
		}
	}
	return q
}

// BenchmarkAttnKeyScores compares, in cache, one decode segment's scores
// (a GQA group's rows against the 16 key rows of a KV block, the pool's
// layout: key rows kvd elements apart) by DotRowsBF16 and by
// AttnKeyScoresBF16, for SmolLM2's shape (3 rows of 64, 3 KV heads; also
// a whole 64-key chunk's rows in one call) and qwen3-0.6b's (2 rows of
// 128, 8 KV heads).
func BenchmarkAttnKeyScores(b *testing.B) {
	keyScoresISA(b)
	r := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct{ rows, hd, kvHeads, nk int }{{3, 64, 3, 16}, {3, 64, 3, 64}, {2, 128, 8, 16}} {
		nk := sh.nk
		ldk := 2 * sh.kvHeads * sh.hd // a block's key and value rows
		keys := make([]uint16, nk*ldk)
		for i := range keys {
			keys[i] = F32ToBF16(float32(r.NormFloat64()))
		}
		q := queryRows(r, sh.rows, sh.hd)
		var bq BF16Query
		bq.Set(q, sh.rows, sh.hd)
		out := make([]float32, sh.rows*64)
		for _, f := range []struct {
			name string
			fn   func(out []float32, ldo int, q *BF16Query, k []uint16, ldk, n int)
		}{{"DotRowsBF16", DotRowsBF16}, {"AttnKeyScoresBF16", AttnKeyScoresBF16}} {
			b.Run(fmt.Sprintf("rows=%d/hd=%d/keys=%d/%s", sh.rows, sh.hd, nk, f.name), func(b *testing.B) {
				for b.Loop() {
					f.fn(out, 64, &bq, keys, ldk, nk)
				}
			})
		}
	}
}

// BenchmarkAxpyRowsBF16Group times, in cache, one decode segment's value
// sums (16 value rows of a KV block into a GQA group's accumulators), for
// SmolLM2's shape (3 rows of 64, 3 KV heads) and qwen3-0.6b's (2 of 128,
// 8 KV heads).
func BenchmarkAxpyRowsBF16Group(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct{ g, hd, kvHeads int }{{3, 64, 3}, {2, 128, 8}} {
		const nk = 16
		ldv := 2 * sh.kvHeads * sh.hd
		v := make([]uint16, nk*ldv)
		for i := range v {
			v[i] = F32ToBF16(float32(r.NormFloat64()))
		}
		alpha := make([]float32, sh.g*64)
		for i := range alpha {
			alpha[i] = r.Float32()
		}
		y := make([]float32, sh.g*sh.hd)
		b.Run(fmt.Sprintf("g=%d/hd=%d", sh.g, sh.hd), func(b *testing.B) {
			for b.Loop() {
				AxpyRowsBF16Group(sh.g, sh.hd, y, sh.hd, alpha, 64, nk, v, ldv)
			}
		})
	}
}
