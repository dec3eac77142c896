package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// bf16ISA selects an ISA with the bf16 attention kernels for the rest of
// the test, or skips it.
func bf16ISA(t testing.TB) {
	t.Helper()
	def := ISA()
	t.Cleanup(func() { _ = SetISA(def) })
	for _, isa := range ISAs() {
		if err := SetISA(isa); err != nil {
			t.Fatal(err)
		}
		if AttnBF16() {
			return
		}
	}
	t.Skip("no ISA with the bf16 attention kernels on this CPU")
}

// extremeBF16 returns a random bf16 value: mostly N(0, σ²), with some
// subnormals, zeros of both signs and values near the largest finite ones
// scaled so that the dot products stay finite.
func extremeBF16(r *rand.Rand, big float32) uint16 {
	switch r.IntN(16) {
	case 0:
		return uint16(r.IntN(0x7f)) | uint16(r.IntN(2))<<15 // subnormal or ±0
	case 1:
		return 0x8000
	case 2:
		v := big * (1 - r.Float32()/2)
		if r.IntN(2) == 0 {
			v = -v
		}
		return F32ToBF16(v)
	case 3:
		return F32ToBF16(float32(r.NormFloat64()) * 1e-30) // products underflow
	}
	return F32ToBF16(float32(r.NormFloat64()) * 2)
}

// TestAttnScoresMatchDotRowsBF16 checks that scoring packed keys gives the
// bits DotRowsBF16 (the matmul kernels' reduction order) gives for the same
// query and key rows, on head dimensions that fill the 32-element steps,
// do not, and are odd, with subnormals, signed zeros, underflowing products
// and large finite values in the data.
func TestAttnScoresMatchDotRowsBF16(t *testing.T) {
	bf16ISA(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, hd := range []int{64, 80, 96, 128, 1, 2, 7, 16, 31, 33, 40, 63, 127, 130, 256} {
		for _, nk := range []int{1, 15, 16, 17, 64, 77} {
			t.Run(fmt.Sprintf("hd %d/%d keys", hd, nk), func(t *testing.T) {
				// |q·k| ≤ hd·big²: keep it below the f32 range.
				big := float32(math.Sqrt(1e37 / float64(hd)))
				ldk := hd + 3
				keys := make([]uint16, nk*ldk)
				for i := range keys {
					keys[i] = extremeBF16(r, big)
				}
				packed := make([]uint32, PackedKeysLen(nk, hd))
				for i := range packed {
					packed[i] = 0xdeadbeef // every word must be written
				}
				PackKeysBF16(packed, 0, keys, ldk, min(5, nk), hd)
				if nk > 5 {
					PackKeysBF16(packed, 5, keys[5*ldk:], ldk, nk-5, hd)
				}
				PackKeysBF16(packed, nk, nil, 0, (nk+15)/16*16-nk, hd)
				const rows = 9
				P2 := 2 * AttnKeyPairs(hd)
				qf := make([]float32, rows*hd)
				qb := make([]uint16, rows*P2)
				for i := range rows {
					for j := range hd {
						qf[i*hd+j] = BF16ToF32(extremeBF16(r, big))
					}
					// Rounded as BF16Query rounds (the model's way).
					ToBF16(qb[i*P2:i*P2+hd], qf[i*hd:(i+1)*hd])
				}
				var q BF16Query
				q.Set(qf, rows, hd)
				want := make([]float32, rows*nk)
				DotRowsBF16(want, nk, &q, keys, ldk, nk)
				groups := (nk + 15) / 16
				for rr := 1; rr <= rows; rr++ {
					ldo := 16*groups + 3
					got := make([]float32, rr*ldo)
					AttnScoresBF16(got, ldo, qb[(rows-rr)*P2:], P2, rr, packed, groups, hd)
					for i := range rr {
						for j := range nk {
							g, w := got[i*ldo+j], want[(rows-rr+i)*nk+j]
							if math.Float32bits(g) != math.Float32bits(w) {
								t.Fatalf("%d rows: row %d key %d: packed score %g (%#x), DotRowsBF16 %g (%#x)",
									rr, rows-rr+i, j, g, math.Float32bits(g), w, math.Float32bits(w))
							}
						}
					}
				}
			})
		}
	}
}

// TestAttnSoftmaxStep checks one online-softmax step against its
// definition in float64: the maximum, the rescale, weights within bf16
// rounding of e^(s−m) and equal to bf16 of ExpSum's exponential, zero
// weights past n, the sum of the rounded
// weights; and that a row's results do not depend on the other rows of
// the call.
func TestAttnSoftmaxStep(t *testing.T) {
	bf16ISA(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, hd := range []int{64, 40, 7} {
		for _, n := range []int{1, 2, 15, 16, 17, 33, 63, 64} {
			const rows = 5
			lds, lda, ldw := 70, hd+1, 66
			s := make([]float32, rows*lds)
			for i := range s {
				s[i] = float32(r.NormFloat64() * 4)
			}
			m := make([]float32, rows)
			l := make([]float32, rows)
			acc := make([]float32, rows*lda)
			for i := range rows {
				m[i] = float32(r.NormFloat64() * 4)
				l[i] = 1 + r.Float32()*10
				if i == 0 {
					m[i], l[i] = float32(math.Inf(-1)), 0 // the first chunk
				}
				for t := range hd {
					if i > 0 {
						acc[i*lda+t] = float32(r.NormFloat64())
					}
				}
			}
			m0, l0, acc0 := append([]float32(nil), m...), append([]float32(nil), l...), append([]float32(nil), acc...)
			w := make([]uint16, rows*ldw)
			for i := range w {
				w[i] = 0xffff
			}
			AttnSoftmaxBF16(s, lds, rows, n, m, l, acc, lda, hd, w, ldw)
			for i := range rows {
				mc := math.Inf(-1)
				for _, v := range s[i*lds : i*lds+n] {
					mc = max(mc, float64(v))
				}
				mnew := max(float64(m0[i]), mc)
				if float64(m[i]) != mnew {
					t.Fatalf("hd %d n %d row %d: m = %g, want %g", hd, n, i, m[i], mnew)
				}
				f := 1.0
				if mc > float64(m0[i]) && !math.IsInf(float64(m0[i]), -1) {
					f = math.Exp(float64(m0[i]) - mc)
				}
				var sum float64
				for j := range AttnChunk {
					got := float64(BF16ToF32(w[i*ldw+j]))
					if j >= n {
						if w[i*ldw+j] != 0 {
							t.Fatalf("hd %d n %d row %d: w[%d] = %#x past n, want 0", hd, n, i, j, w[i*ldw+j])
						}
						continue
					}
					e := math.Exp(float64(s[i*lds+j]) - mnew)
					if math.Abs(got-e) > e*(1.0/256+1e-6) {
						t.Fatalf("hd %d n %d row %d: w[%d] = %g, e^(s−m) = %g", hd, n, i, j, got, e)
					}
					// The exponential is ExpSum's, bit for bit.
					x := []float32{s[i*lds+j]}
					ExpSum(x, m[i])
					if w[i*ldw+j] != F32ToBF16(x[0]) {
						t.Fatalf("hd %d n %d row %d: w[%d] = %#x, bf16 of ExpSum's e^(s−m) %#x", hd, n, i, j, w[i*ldw+j], F32ToBF16(x[0]))
					}
					sum += got
				}
				wantL := float64(l0[i])*f + sum
				if math.Abs(float64(l[i])-wantL) > 1e-5*wantL {
					t.Fatalf("hd %d n %d row %d: l = %g, want %g", hd, n, i, l[i], wantL)
				}
				for t2 := range hd {
					want := float64(acc0[i*lda+t2]) * f
					if math.Abs(float64(acc[i*lda+t2])-want) > 4e-6*math.Abs(want)+1e-30 {
						t.Fatalf("hd %d n %d row %d: acc[%d] = %g, want %g", hd, n, i, t2, acc[i*lda+t2], want)
					}
				}
				// The row alone gives the same bits.
				m1, l1 := []float32{m0[i]}, []float32{l0[i]}
				a1 := append([]float32(nil), acc0[i*lda:i*lda+hd]...)
				w1 := make([]uint16, AttnChunk)
				AttnSoftmaxBF16(s[i*lds:], lds, 1, n, m1, l1, a1, hd, hd, w1, AttnChunk)
				if m1[0] != m[i] || math.Float32bits(l1[0]) != math.Float32bits(l[i]) {
					t.Fatalf("hd %d n %d row %d: alone m, l = %g, %g; in a batch %g, %g", hd, n, i, m1[0], l1[0], m[i], l[i])
				}
				for j := range AttnChunk {
					if w1[j] != w[i*ldw+j] {
						t.Fatalf("hd %d n %d row %d: alone w[%d] = %#x; in a batch %#x", hd, n, i, j, w1[j], w[i*ldw+j])
					}
				}
				for t2 := range hd {
					if math.Float32bits(a1[t2]) != math.Float32bits(acc[i*lda+t2]) {
						t.Fatalf("hd %d n %d row %d: alone acc[%d] differs", hd, n, i, t2)
					}
				}
			}
		}
	}
}

// TestAttnPVSplitsAndBatches checks the weighted value sum against float64
// (one rounding per pair step) with the value rows in shuffled places,
// that an odd last key never reads the next value row (NaN there), that
// splitting the keys at even counts and computing rows alone or in blocks
// give the same bits.
func TestAttnPVSplitsAndBatches(t *testing.T) {
	bf16ISA(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, hd := range []int{64, 128, 80, 40, 16, 8, 7, 33, 1} {
		for _, n := range []int{1, 2, 3, 16, 17, 63, 64} {
			for _, rows := range []int{1, 2, 3, 4, 5, 6, 7, 8, 13, 27} {
				v, w, acc0, ldv, lda, ldw := pvOperands(r, hd, n, rows)
				// Rows ldv apart, but in shuffled order: row j at slot perm[j].
				perm := r.Perm(n + 1)
				vs := make([]uint16, len(v))
				offs := make([]int, n+1)
				for j := range n + 1 {
					offs[j] = perm[j] * ldv
					copy(vs[offs[j]:offs[j]+ldv], v[j*ldv:(j+1)*ldv])
				}
				got := append([]float32(nil), acc0...)
				AttnPVBF16(got, lda, w, ldw, rows, vs, offs, n, hd)
				for i := range rows {
					for t2 := range hd {
						want := float64(acc0[i*lda+t2])
						var mag float64
						for j := range n {
							p := float64(BF16ToF32(w[i*ldw+j])) * float64(BF16ToF32(v[j*ldv+t2]))
							want += p
							mag += math.Abs(p)
						}
						g := float64(got[i*lda+t2])
						if math.IsNaN(g) || math.Abs(g-want) > 1e-6*(mag+math.Abs(float64(acc0[i*lda+t2])))*float64(n+1) {
							t.Fatalf("hd %d n %d rows %d: acc[%d][%d] = %g, float64 %g", hd, n, rows, i, t2, g, want)
						}
					}
				}
				// Split at even key counts, rows one at a time.
				for split := 0; split <= n; split += 2 {
					for i := range rows {
						a := append([]float32(nil), acc0[i*lda:i*lda+hd]...)
						AttnPVBF16(a, hd, w[i*ldw:], ldw, 1, vs, offs, split, hd)
						AttnPVBF16(a, hd, w[i*ldw+split:], ldw, 1, vs, offs[split:], n-split, hd)
						for t2 := range hd {
							if math.Float32bits(a[t2]) != math.Float32bits(got[i*lda+t2]) {
								t.Fatalf("hd %d n %d rows %d: row %d split at %d: acc[%d] = %g, one call %g", hd, n, rows, i, split, t2, a[t2], got[i*lda+t2])
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkAttnKernels measures the bf16 attention kernels on the
// smollm2-135m shape (head_dim 64, GQA group 3, a 16-token tile = 48 query
// rows) over 2048 keys in chunks of 64. GFLOP/s counts 2·head_dim flops per
// (row, key) for the scores and the same for the value sum.
func BenchmarkAttnKernels(b *testing.B) {
	bf16ISA(b)
	const hd, rows, nk = 64, 48, 2048
	r := rand.New(rand.NewPCG(1, 1))
	keys := make([]uint16, nk*hd)
	for i := range keys {
		keys[i] = F32ToBF16(float32(r.NormFloat64()))
	}
	packed := make([]uint32, PackedKeysLen(nk, hd))
	PackKeysBF16(packed, 0, keys, hd, nk, hd)
	P2 := 2 * AttnKeyPairs(hd)
	q := make([]uint16, rows*P2)
	for i := range q {
		q[i] = F32ToBF16(float32(r.NormFloat64()) * 0.2)
	}
	s := make([]float32, rows*AttnChunk)
	w := make([]uint16, rows*AttnChunk)
	acc := make([]float32, rows*hd)
	m := make([]float32, rows)
	l := make([]float32, rows)
	flops := 2 * float64(hd) * rows * nk
	report := func(b *testing.B, f float64) {
		b.ReportMetric(f*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	}
	b.Run("scores", func(b *testing.B) {
		for b.Loop() {
			for c0 := 0; c0 < nk; c0 += AttnChunk {
				AttnScoresBF16(s, AttnChunk, q, P2, rows, packed[c0/16*16*P2/2:], AttnChunk/16, hd)
			}
		}
		report(b, flops)
	})
	b.Run("softmax", func(b *testing.B) {
		for b.Loop() {
			for i := range m {
				m[i], l[i] = float32(math.Inf(-1)), 0
			}
			for c0 := 0; c0 < nk; c0 += AttnChunk {
				AttnSoftmaxBF16(s, AttnChunk, rows, AttnChunk, m, l, acc, hd, hd, w, AttnChunk)
			}
		}
		b.ReportMetric(float64(rows*nk)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gkeys/s")
	})
	offs := make([]int, nk)
	for j := range offs {
		offs[j] = j * hd
	}
	b.Run("pv", func(b *testing.B) {
		for b.Loop() {
			for c0 := 0; c0 < nk; c0 += AttnChunk {
				AttnPVBF16(acc, hd, w, AttnChunk, rows, keys, offs[c0:], AttnChunk, hd)
			}
		}
		report(b, flops)
	})
}

// TestAssemblySetsHaveAttentionScanKernels guards the attention kernels
// that every assembly ISA needs at long context: without them the value
// sums widen each bf16 row in Go and the row maxima scan in Go (on AVX2
// that made a 2,048-token attention 5× slower).
func TestAssemblySetsHaveAttentionScanKernels(t *testing.T) {
	for _, ks := range kernelSets {
		if ks.name == "go" {
			continue
		}
		if ks.axpyRowsBF16 == nil || ks.argMax == nil {
			t.Errorf("%s: no axpyRowsBF16 or argMax kernel", ks.name)
		}
		for g, f := range ks.axpyRowsBF16G {
			if f == nil {
				t.Errorf("%s: no axpyRowsBF16G kernel for %d outputs", ks.name, g+2)
			}
		}
		if ks.axpyRows == nil {
			t.Errorf("%s: no axpyRows kernel (f32 value rows)", ks.name)
		}
	}
}

// pvOperands makes random operands for AttnPVBF16 over n keys of hd
// dimensions and rows query rows: n+1 value rows ldv apart (the last one
// NaN, a slot past the keys that must not be read), weights ldw apart
// (zero past the n keys) and accumulators lda apart.
func pvOperands(r *rand.Rand, hd, n, rows int) (v, w []uint16, acc0 []float32, ldv, lda, ldw int) {
	ldv, lda, ldw = hd+5, hd+2, AttnChunk+2
	v = make([]uint16, (n+1)*ldv)
	for i := range v {
		v[i] = F32ToBF16(float32(r.NormFloat64()))
	}
	for i := range hd {
		v[n*ldv+i] = 0x7fc0 // NaN in the slot past the last key
	}
	w = make([]uint16, rows*ldw)
	for i := range rows {
		for j := range n {
			w[i*ldw+j] = F32ToBF16(r.Float32())
		}
	}
	acc0 = make([]float32, rows*lda)
	for i := range acc0 {
		acc0[i] = float32(r.NormFloat64())
	}
	return v, w, acc0, ldv, lda, ldw
}
