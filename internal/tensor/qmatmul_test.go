package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// randQuantMat returns a rows×cols matrix of dtype d quantized from random
// Gaussian weights (σ varied per row).
func randQuantMat(t testing.TB, rng *rand.Rand, d DType, rows, cols int) *Mat {
	x := make([]float32, rows*cols)
	for r := range rows {
		sigma := math.Ldexp(1, rng.IntN(6)-4)
		for c := range cols {
			x[r*cols+c] = float32(rng.NormFloat64() * sigma)
		}
	}
	q, err := QuantizeRows(d, x, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	return &Mat{DType: d, Rows: rows, Cols: cols, Q: q}
}

// refActs quantizes one activation row the way the definition says,
// independently of the package (q8_0 per 32 with an f16 scale, or q8_K per
// 256): the int levels, and per block the scale.
func refActs(d DType, x []float32) (q []int64, scales []float32) {
	elems, _ := d.BlockSize()
	for b := 0; b < len(x); b += elems {
		blk := x[b : b+elems]
		if elems == 32 {
			var amax float32
			for _, v := range blk {
				amax = float32(math.Max(float64(amax), math.Abs(float64(v))))
			}
			s := amax / 127
			var inv float32
			if s != 0 {
				inv = 1 / s
			}
			for _, v := range blk {
				q = append(q, int64(math.Round(float64(v*inv))))
			}
			scales = append(scales, F16ToF32(F32ToF16(s)))
			continue
		}
		var mx, amax float32
		for _, v := range blk {
			if math.Abs(float64(v)) > float64(amax) {
				amax, mx = float32(math.Abs(float64(v))), v
			}
		}
		if amax == 0 {
			q = append(q, make([]int64, elems)...)
			scales = append(scales, 0)
			continue
		}
		inv := -127 / mx
		for _, v := range blk {
			q = append(q, min(127, int64(math.RoundToEven(float64(inv*v)))))
		}
		scales = append(scales, 1/inv)
	}
	return q, scales
}

// fmaExact returns a·b+c rounded once to float32, with big.Float.
func fmaExact(a, b, c float32) float32 {
	p := new(big.Float).SetPrec(200).SetFloat64(float64(a))
	p.Mul(p, new(big.Float).SetPrec(200).SetFloat64(float64(b)))
	p.Add(p, new(big.Float).SetPrec(200).SetFloat64(float64(c)))
	r, _ := new(big.Float).SetPrec(24).SetMode(big.ToNearestEven).Set(p).Float32()
	if r == 0 {
		// The sign of a zero sum under round to nearest: −0 only if both
		// addends are −0.
		if math.Signbit(float64(a*b)) && math.Signbit(float64(c)) {
			return float32(math.Copysign(0, -1))
		}
		return 0
	}
	return r
}

func TestFMA32IsOneRounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	check := func(a, b, c float32) {
		if got, want := fma32(a, b, c), fmaExact(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#x), want %g (%#x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for range 200000 {
		a := float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
		b := float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
		c := float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
		check(a, b, c)
		// Near-ties: c = −a·b rounded plus a half ulp of something.
		p := a * b
		check(a, b, -p)
		check(a, b, float32(math.Ldexp(float64(p), -25)))
	}
	// Exact double-rounding cases: a·b = 1 + 2⁻²⁴ + 2⁻⁵⁰-ish.
	check(1+0x1p-12, 1+0x1p-12, 0x1p-48)
	check(1+0x1p-12, 1-0x1p-12, -0x1p-48)
	check(0, -1, 0)
	check(0, -1, float32(math.Copysign(0, -1)))
}

// refQuantDot returns out[i][j] of the quantized product by the definition
// (with the exact oracle for the fused multiply-adds), and Σ|terms| for a
// float64 bound, and the float64 value of Σ ŵ·x̂ over the dequantized
// weights and activations.
func refQuantDot(w *Mat, xq []int64, xs []float32, j int) (def float32, f64, mag float64) {
	rb, _ := w.DType.RowBytes(w.Cols)
	row := w.Q[j*rb : (j+1)*rb]
	elems, bytes := w.DType.BlockSize()
	var acc float32
	for b := 0; b < w.Cols/elems; b++ {
		vals, _ := blockValues64(w.DType, row[b*bytes:(b+1)*bytes])
		blk := row[b*bytes : (b+1)*bytes]
		h := func(off int) float32 { return F16ToF32(uint16(blk[off]) | uint16(blk[off+1])<<8) }
		switch w.DType {
		case Q8_0, Q4_0, Q5_0:
			var s int64
			for i := range 32 {
				var lv int64
				switch w.DType {
				case Q4_0:
					lv = int64(blk[2+i%16]>>(4*(i/16))&15) - 8
				case Q5_0:
					lv = int64(q5_0Value(blk, i)) - 16
				default:
					lv = int64(int8(blk[2+i]))
				}
				s += lv * xq[b*32+i]
				f64 += vals[i] * float64(xq[b*32+i]) * float64(xs[b])
			}
			acc = fmaExact(float32(s), h(0)*xs[b], acc)
			mag += math.Abs(float64(s)) * math.Abs(float64(h(0)*xs[b]))
		default:
			// Recover the integer structure from the float64 values:
			// Σ ŵ·q = d·Σ sc·q·x − dmin·Σ m·x is what I and M encode.
			// Recompute I and M directly from the fields instead.
			five := w.DType == Q5_K
			var is, ms int64
			if w.DType == Q6_K {
				for s := range 16 {
					var dsum int64
					for t := range 16 {
						q, _ := q6Value(blk, 16*s+t)
						dsum += int64(q-32) * xq[b*256+16*s+t]
					}
					is += int64(int8(blk[192+s])) * dsum
				}
				acc = fmaExact(float32(is), h(208)*xs[b], acc)
				mag += math.Abs(float64(is)) * math.Abs(float64(h(208)*xs[b]))
			} else {
				for jj := range 8 {
					sc, m := scaleMinK4(blk[4:16], jj)
					var dsum, xsum int64
					for t := range 32 {
						dsum += int64(q4KValue(five, blk, 32*jj+t)) * xq[b*256+32*jj+t]
						xsum += xq[b*256+32*jj+t]
					}
					is += int64(sc) * dsum
					ms += int64(m) * xsum
				}
				acc = fmaExact(float32(is), h(0)*xs[b], acc)
				acc = fmaExact(-float32(ms), h(2)*xs[b], acc)
				mag += math.Abs(float64(is))*math.Abs(float64(h(0)*xs[b])) + math.Abs(float64(ms))*math.Abs(float64(h(2)*xs[b]))
			}
			for i := range 256 {
				f64 += vals[i] * float64(xq[b*256+i]) * float64(xs[b])
			}
		}
	}
	return acc, f64, mag
}

func TestQuantMatMulMatchesReference(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 256}, {1, 7, 512}, {3, 16, 256}, {2, 33, 768}, {5, 50, 256}, {17, 19, 512}, {9, 64, 1024}, {4, 3, 2304},
	}
	forEachISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			pool := NewPool(threads)
			defer pool.Close()
			for _, d := range quantTypes {
				for _, s := range shapes {
					k := s.k
					if elems, _ := d.BlockSize(); elems == 32 {
						k = s.k/8 + 32 // odd block counts too
					}
					t.Run(fmt.Sprintf("%s m=%d n=%d k=%d T=%d", d, s.m, s.n, k, threads), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(s.m*100+s.n), uint64(k)))
						w := randQuantMat(t, rng, d, s.n, k)
						x := make([]float32, s.m*k)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						if s.m > 1 {
							clear(x[k : k+min(k, 256)]) // an all-zero block of activations
						}
						out := make([]float32, s.m*s.n)
						for i := range out {
							out[i] = float32(math.NaN())
						}
						pool.MatMul(out, x, s.m, w)
						for i := range s.m {
							xq, xs := refActs(d, x[i*k:(i+1)*k])
							for j := range s.n {
								def, f64, mag := refQuantDot(w, xq, xs, j)
								got := out[i*s.n+j]
								if math.Float32bits(got) != math.Float32bits(def) {
									t.Fatalf("out[%d][%d] = %g (%#x), the definition gives %g (%#x)", i, j, got, math.Float32bits(got), def, math.Float32bits(def))
								}
								if math.Abs(float64(got)-f64) > 1e-5*mag+1e-30 {
									t.Fatalf("out[%d][%d] = %g, float64 reference %g (Σ|terms| %g)", i, j, got, f64, mag)
								}
							}
						}
					})
				}
			}
		}
	})
}

func TestQuantMatMulIsBatchInvariant(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33}
	shapes := []struct{ n, k int }{{37, 256}, {64, 512}, {21, 768}, {16, 1536}, {50, 256}, {3, 2048}}
	// Results are the same on every ISA, not only within one: keep the
	// first ISA's outputs to compare.
	first := map[string][]float32{}
	forEachISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			pool := NewPool(threads)
			defer pool.Close()
			for _, d := range quantTypes {
				for _, s := range shapes {
					key := fmt.Sprintf("%s n=%d k=%d", d, s.n, s.k)
					t.Run(fmt.Sprintf("%s T=%d", key, threads), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(s.n), uint64(s.k)))
						w := randQuantMat(t, rng, d, s.n, s.k)
						const rows = 33
						x := make([]float32, rows*s.k)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						alone := make([]float32, rows*s.n)
						for i := range rows {
							pool.MatMul(alone[i*s.n:(i+1)*s.n], x[i*s.k:(i+1)*s.k], 1, w)
						}
						for _, m := range ms {
							out := make([]float32, m*s.n)
							pool.MatMul(out, x[:m*s.k], m, w)
							for i := range m * s.n {
								if math.Float32bits(out[i]) != math.Float32bits(alone[i]) {
									t.Fatalf("m=%d: out[%d][%d] = %x, alone %x", m, i/s.n, i%s.n, math.Float32bits(out[i]), math.Float32bits(alone[i]))
								}
							}
						}
						if f, ok := first[key]; !ok {
							first[key] = alone
						} else {
							for i := range f {
								if math.Float32bits(f[i]) != math.Float32bits(alone[i]) {
									t.Fatalf("ISA %s: out[%d][%d] = %x, the first ISA gave %x", ISA(), i/s.n, i%s.n, math.Float32bits(alone[i]), math.Float32bits(f[i]))
								}
							}
						}
					})
				}
			}
		}
	})
}

func TestQuantMatMulWorkSplitAndRowGroups(t *testing.T) {
	// Large enough to be split across workers, and every weight row alone
	// must give its column of the full product.
	forEachISA(t, func(t *testing.T) {
		for _, d := range quantTypes {
			rng := rand.New(rand.NewPCG(7, uint64(d)))
			const n, m, k = 300, 11, 512
			w := randQuantMat(t, rng, d, n, k)
			x := make([]float32, m*k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			p1, p2 := NewPool(1), NewPool(2)
			defer p1.Close()
			defer p2.Close()
			a, b := make([]float32, m*n), make([]float32, m*n)
			p1.MatMul(a, x, m, w)
			p2.MatMul(b, x, m, w)
			rb, _ := d.RowBytes(k)
			for j := range n {
				one := make([]float32, m)
				p1.MatMul(one, x, m, &Mat{DType: d, Rows: 1, Cols: k, Q: w.Q[j*rb : (j+1)*rb]})
				for i := range m {
					if math.Float32bits(a[i*n+j]) != math.Float32bits(b[i*n+j]) || math.Float32bits(a[i*n+j]) != math.Float32bits(one[i]) {
						t.Fatalf("%s out[%d][%d]: 1 thread %g, 2 threads %g, row alone %g", d, i, j, a[i*n+j], b[i*n+j], one[i])
					}
				}
			}
			// One activation row (decode) is split into fewer, longer
			// ranges per thread than several rows are; each activation row
			// must still match its column of the 1-thread product.
			for i := range m {
				one := make([]float32, n)
				p2.MatMul(one, x[i*k:(i+1)*k], 1, w)
				for j := range n {
					if math.Float32bits(one[j]) != math.Float32bits(a[i*n+j]) {
						t.Fatalf("%s row %d alone on 2 threads: out[%d] = %g, 1 thread %g", d, i, j, one[j], a[i*n+j])
					}
				}
			}
		}
	})
}

func TestQuantMatMulPanicsOnBadShapes(t *testing.T) {
	pool := NewPool(1)
	defer pool.Close()
	cases := []struct {
		name string
		w    *Mat
	}{
		{"cols not a block multiple", &Mat{DType: Q8_0, Rows: 2, Cols: 48, Q: make([]byte, 2*34*2)}},
		{"cols not a super-block multiple", &Mat{DType: Q4_K, Rows: 2, Cols: 128, Q: make([]byte, 2*144)}},
		{"short blocks", &Mat{DType: Q6_K, Rows: 2, Cols: 256, Q: make([]byte, 2*210-1)}},
		{"blocks missing", &Mat{DType: Q4_0, Rows: 2, Cols: 32}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("MatMul did not panic")
				}
			}()
			pool.MatMul(make([]float32, 2*c.w.Rows), make([]float32, 2*c.w.Cols), 2, c.w)
		})
	}
}

func TestQuantizeActsMatchesGo(t *testing.T) {
	// Rows with ties for both roundings (q8_0 rounds half away from zero,
	// q8_K to even), zero blocks, ± largest magnitudes in either order,
	// tiny and huge values, and random ones.
	const k = 1024
	rng := rand.New(rand.NewPCG(8, 8))
	var rows [][]float32
	tie := make([]float32, k)
	for i := range tie {
		tie[i] = float32(i%64) - 31.5
		if i%32 == 0 {
			tie[i] = 127
		}
		if i%256 == 0 {
			tie[i] = -127
		}
	}
	rows = append(rows, tie)
	signs := make([]float32, k)
	for i := range signs {
		signs[i] = float32(rng.NormFloat64())
	}
	signs[3], signs[9] = 8, -8 // +8 first: q8_K's scale is positive
	signs[300], signs[301] = -9, 9
	rows = append(rows, signs)
	mixed := make([]float32, k)
	for i := range mixed {
		mixed[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(60)-30))
	}
	clear(mixed[256:512])
	mixed[600] = float32(math.Copysign(0, -1))
	rows = append(rows, mixed)
	for range 5 {
		rows = append(rows, randVec(rng, k))
	}
	x := make([]float32, 0, len(rows)*k)
	for _, r := range rows {
		x = append(x, r...)
	}
	m := len(rows)
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(2)
		defer pool.Close()
		for _, d := range []DType{Q8_0, Q4_0, Q5_0, Q4_K} {
			var a qAct
			pool.quantizeActs(active.Load(), &a, d, x, m, k)
			words, elems := metaWords(d)
			nb := k / elems
			q := make([]int8, m*k)
			meta := make([]uint32, m*nb*words)
			for r := range m {
				for b := range nb {
					o := r*k + b*elems
					mo := (r*nb + b) * words
					if elems == 32 {
						quantizeActQ8_0(d, x[o:o+32], q[o:o+32], meta[mo:mo+2])
					} else {
						quantizeActQ8K(x[o:o+qk], q[o:o+qk], meta[mo:mo+16])
					}
				}
			}
			for i := range q {
				if q[i] != a.xq[i] {
					t.Fatalf("%s: level %d (row %d) = %d, Go gives %d (x = %g)", d, i, i/k, a.xq[i], q[i], x[i])
				}
			}
			for i := range meta {
				if meta[i] != a.meta[i] {
					t.Fatalf("%s: meta word %d (row %d) = %#x, Go gives %#x", d, i, i/(nb*words), a.meta[i], meta[i])
				}
			}
		}
	})
}

// TestQuantMatVecMatchesDefinition covers the decode path (one activation
// row), whose kernels read each weight row whole in groups of blocks: block
// counts around the group sizes (the last group of a row overlaps the one
// before), row counts around the 8 rows of one call, weight bytes of every
// value (Q8_0 −128, which our quantizer never writes, large K-quant scales
// and mins) and activation blocks of zeros and of ±127 everywhere.
func TestQuantMatVecMatchesDefinition(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		for _, d := range quantTypes {
			elems, bytes := d.BlockSize()
			for _, nb := range []int{1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 40} {
				k := nb * elems
				for _, n := range []int{1, 7, 8, 9, 23} {
					t.Run(fmt.Sprintf("%s nb=%d n=%d", d, nb, n), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(nb), uint64(n)))
						w := randQuantMat(t, rng, d, n, k)
						if n > 2 {
							// Row 1: random bytes everywhere but sane
							// f16 scales (every level pattern, and the
							// K-quants' 6-bit scales and mins at will).
							rb, _ := d.RowBytes(k)
							row := w.Q[rb : 2*rb]
							for i := range row {
								row[i] = byte(rng.Uint32())
							}
							for b := range nb {
								blk := row[b*bytes : (b+1)*bytes]
								for _, off := range f16Offsets(d) {
									binary.LittleEndian.PutUint16(blk[off:], F32ToF16(float32(rng.Float64()+0.01)))
								}
							}
						}
						x := make([]float32, k)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						if nb > 2 {
							clear(x[elems : 2*elems])
							for i := 2 * elems; i < 3*elems; i++ {
								x[i] = float32(1 - 2*(i%2))
							}
						}
						out := make([]float32, n)
						pool.MatMul(out, x, 1, w)
						xq, xs := refActs(d, x)
						for j := range n {
							def, _, _ := refQuantDot(w, xq, xs, j)
							if math.Float32bits(out[j]) != math.Float32bits(def) {
								t.Fatalf("out[%d] = %g (%#x), the definition gives %g (%#x)", j, out[j], math.Float32bits(out[j]), def, math.Float32bits(def))
							}
						}
					})
				}
			}
		}
	})
}

// f16Offsets returns where a block of dtype d holds f16 scales.
func f16Offsets(d DType) []int {
	switch d {
	case Q4_K, Q5_K:
		return []int{0, 2}
	case Q6_K:
		return []int{208}
	}
	return []int{0}
}

// TestQuantMatVecExtremes checks the one-row kernels, and the panel kernels
// of several activation rows, where their exact integer sums are largest:
// every level at its maximum (all weight bytes 0xff but the f16 scales)
// times activations all at ±127 (the AVX-512 Q4_K/Q5_K row kernel adds
// pairs of its sums in int16, the AVX2 K-quant panel kernels up to 8).
func TestQuantMatVecExtremes(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		for _, d := range quantTypes {
			elems, bytes := d.BlockSize()
			for _, c := range []struct {
				sign float32
				m    int
			}{{1, 1}, {-1, 1}, {1, 7}, {-1, 7}} {
				sign := c.sign
				t.Run(fmt.Sprintf("%s x=%g m=%d", d, sign, c.m), func(t *testing.T) {
					const nb, n = 9, 9
					k := nb * elems
					rb, _ := d.RowBytes(k)
					w := &Mat{DType: d, Rows: n, Cols: k, Q: make([]byte, n*rb)}
					for i := range w.Q {
						w.Q[i] = 0xff
					}
					for b := range n * nb {
						for _, off := range f16Offsets(d) {
							binary.LittleEndian.PutUint16(w.Q[b*bytes+off:], F32ToF16(0.5))
						}
					}
					x := make([]float32, c.m*k)
					for i := range x {
						x[i] = sign
					}
					out := make([]float32, c.m*n)
					pool.MatMul(out, x, c.m, w)
					xq, xs := refActs(d, x[:k])
					for i := range c.m {
						for j := range n {
							def, _, _ := refQuantDot(w, xq, xs, j)
							if math.Float32bits(out[i*n+j]) != math.Float32bits(def) {
								t.Fatalf("out[%d][%d] = %g, the definition gives %g", i, j, out[i*n+j], def)
							}
						}
					}
				})
			}
		}
	})
}

// TestQuantMatVecRegions checks one activation row against the definition
// for row counts where the AVX2 row kernels' driver splits a thread's rows
// into regions read side by side (many calls per region, rows left over
// after the regions, one and two threads).
func TestQuantMatVecRegions(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			pool := NewPool(threads)
			defer pool.Close()
			for _, d := range quantTypes {
				elems, _ := d.BlockSize()
				k := 2 * max(8*elems, 1024)
				for _, n := range []int{64, 67, 131, 301} {
					t.Run(fmt.Sprintf("%s n=%d T=%d", d, n, threads), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(n), uint64(d)))
						w := randQuantMat(t, rng, d, n, k)
						x := make([]float32, k)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						out := make([]float32, n)
						pool.MatMul(out, x, 1, w)
						xq, xs := refActs(d, x)
						for j := range n {
							def, _, _ := refQuantDot(w, xq, xs, j)
							if math.Float32bits(out[j]) != math.Float32bits(def) {
								t.Fatalf("out[%d] = %g (%#x), the definition gives %g (%#x)", j, out[j], math.Float32bits(out[j]), def, math.Float32bits(def))
							}
						}
					})
				}
			}
		}
	})
}

// TestRow8RegionsSpreadsStreams checks that the 8-row kernels' regions,
// for the matrix shapes of the models and benchmarks (where r·rb is
// mostly a multiple of 4096: all 8 streams at one offset in a page), take
// at most r/32 rows (7 at the most) fewer per region, never put the
// streams closer than r does, keep r where its streams are 256 bytes
// apart, and where 7 rows may go, put them at least 256 bytes apart
// modulo 4096; and streamsApart against the distance of every pair.
func TestRow8RegionsSpreadsStreams(t *testing.T) {
	for _, d := range []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
		for _, s := range []struct{ n, k int }{
			{64, 4096}, {96, 576}, {192, 576}, {576, 576}, {576, 1536}, {1024, 1024}, {1024, 3072},
			{1536, 576}, {2048, 2048}, {2048, 4096}, {3072, 1024}, {8192, 2048}, {151936, 1024},
		} {
			rb, err := d.RowBytes(s.k)
			if err != nil {
				continue // K not a multiple of the dtype's block
			}
			r := s.n / qRowMax
			c := row8Regions(r, rb)
			if c > r || c < r-min(qRowMax-1, r/32) {
				t.Errorf("%s %dx%d: row8Regions(%d, %d) = %d, want %d..%d", d, s.n, s.k, r, rb, c, r-min(qRowMax-1, r/32), r)
			}
			got, at := streamsApart(c*rb), streamsApart(r*rb)
			if got < at || (at >= 256 && c != r) {
				t.Errorf("%s %dx%d: %d rows a region put the streams %d bytes apart, %d at %d rows", d, s.n, s.k, c, got, at, r)
			}
			if r >= 32*(qRowMax-1) && got < 256 {
				t.Errorf("%s %dx%d: %d rows a region put two streams %d bytes apart modulo 4096, want ≥ 256", d, s.n, s.k, c, got)
			}
			for _, lds := range []int{r * rb, c * rb} {
				near := 4096
				for i := range qRowMax {
					for j := i + 1; j < qRowMax; j++ {
						e := (j*lds - i*lds) % 4096
						near = min(near, e, 4096-e)
					}
				}
				if got := streamsApart(lds); got != near {
					t.Errorf("streamsApart(%d) = %d, pairwise %d", lds, got, near)
				}
			}
		}
	}
}

// TestQuantMatMulRowsPastTheRegionsMatchRowsAlone checks one activation
// row against a matrix whose 8-row kernels' regions leave rows to the
// two-phase kernels (2053 rows of 1024 columns: 8 regions of 256 rows put
// the streams of every dtype at one offset in a page, so row8Regions takes
// fewer, and 5 more rows are past any multiple of 8): each output must be
// what that weight row alone gives.
func TestQuantMatMulRowsPastTheRegionsMatchRowsAlone(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		for _, d := range quantTypes {
			const n, k = 2053, 1024
			rng := rand.New(rand.NewPCG(11, uint64(d)))
			w := randQuantMat(t, rng, d, n, k)
			x := randVec(rng, k)
			out := make([]float32, n)
			pool.MatMul(out, x, 1, w)
			rb, _ := d.RowBytes(k)
			one := make([]float32, 1)
			for j := range n {
				pool.MatMul(one, x, 1, &Mat{DType: d, Rows: 1, Cols: k, Q: w.Q[j*rb : (j+1)*rb]})
				if math.Float32bits(out[j]) != math.Float32bits(one[0]) {
					t.Fatalf("%s out[%d] = %x, the row alone %x", d, j, math.Float32bits(out[j]), math.Float32bits(one[0]))
				}
			}
		}
	})
}
