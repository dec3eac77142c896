package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// forEachISA runs f with every kernel implementation this CPU supports
// selected, restoring the default afterwards.
func forEachISA(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	def := ISA()
	t.Cleanup(func() { _ = SetISA(def) })
	for _, name := range ISAs() {
		t.Run(name, func(t *testing.T) {
			if err := SetISA(name); err != nil {
				t.Fatal(err)
			}
			f(t)
		})
	}
}

// randMat returns a rows×cols matrix of dtype dt with entries in [-1,1),
// and the same values widened to float64.
func randMat(rng *rand.Rand, dt DType, rows, cols int) (*Mat, []float64) {
	w := &Mat{DType: dt, Rows: rows, Cols: cols}
	ref := make([]float64, rows*cols)
	switch dt {
	case F32:
		w.F32 = make([]float32, rows*cols)
		for i := range w.F32 {
			w.F32[i] = rng.Float32()*2 - 1
			ref[i] = float64(w.F32[i])
		}
	case BF16, F16:
		w.U16 = make([]uint16, rows*cols)
		for i := range w.U16 {
			v := rng.Float32()*2 - 1
			if dt == BF16 {
				w.U16[i] = F32ToBF16(v)
				ref[i] = float64(BF16ToF32(w.U16[i]))
			} else {
				w.U16[i] = F32ToF16(v)
				ref[i] = float64(F16ToF32(w.U16[i]))
			}
		}
	}
	return w, ref
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	return v
}

var dtypes = []DType{F32, BF16, F16}

func TestMatMulMatchesFloat64Reference(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 7, 8}, {3, 5, 15}, {4, 4, 16}, {5, 9, 17}, {2, 13, 31},
		{7, 64, 64}, {9, 172, 64}, {6, 64, 172}, {1, 33, 200}, {17, 19, 257}, {64, 37, 48},
		{3, 6, 0}, {0, 5, 5},
	}
	forEachISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			pool := NewPool(threads)
			defer pool.Close()
			for _, dt := range dtypes {
				for _, s := range shapes {
					name := fmt.Sprintf("%s m=%d n=%d k=%d threads=%d", dt, s.m, s.n, s.k, threads)
					t.Run(name, func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(s.m*1000+s.n), uint64(s.k)))
						w, wref := randMat(rng, dt, s.n, s.k)
						x := randVec(rng, s.m*s.k)
						out := make([]float32, s.m*s.n)
						for i := range out {
							out[i] = float32(math.NaN()) // every element must be written
						}
						pool.MatMul(out, x, s.m, w)
						// Kernel sets that multiply bf16 by bf16 see the
						// activations rounded to bf16.
						xref := x
						if dt == BF16 && active.Load().toBF16 != nil {
							xref = make([]float32, len(x))
							for i, v := range x {
								xref[i] = BF16ToF32(F32ToBF16(v))
							}
						}
						for i := range s.m {
							for j := range s.n {
								var ref, mag float64
								for kk := range s.k {
									p := float64(xref[i*s.k+kk]) * wref[j*s.k+kk]
									ref += p
									mag += math.Abs(p)
								}
								got := float64(out[i*s.n+j])
								if math.Abs(got-ref) > 1e-5*mag+1e-30 || math.IsNaN(got) {
									t.Fatalf("out[%d][%d] = %g, want %g (Σ|x·w| = %g)", i, j, got, ref, mag)
								}
							}
						}
					})
				}
			}
		}
	})
}

func TestMatMulIsBatchInvariant(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64}
	shapes := []struct{ n, k int }{{37, 64}, {64, 172}, {21, 8}, {50, 33}, {9, 100}, {40, 576}, {29, 48}, {23, 60}, {13, 16}, {31, 1536}, {20, 1103}, {27, 117}}
	forEachISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			pool := NewPool(threads)
			defer pool.Close()
			for _, dt := range dtypes {
				for _, s := range shapes {
					t.Run(fmt.Sprintf("%s n=%d k=%d threads=%d", dt, s.n, s.k, threads), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(s.n), uint64(s.k)))
						w, _ := randMat(rng, dt, s.n, s.k)
						x := randVec(rng, 64*s.k)
						// Each row alone, through the single-row path.
						alone := make([]float32, 64*s.n)
						for i := range 64 {
							pool.MatMul(alone[i*s.n:(i+1)*s.n], x[i*s.k:(i+1)*s.k], 1, w)
						}
						for _, m := range ms {
							out := make([]float32, m*s.n)
							pool.MatMul(out, x[:m*s.k], m, w)
							for i := range m * s.n {
								if math.Float32bits(out[i]) != math.Float32bits(alone[i]) {
									t.Fatalf("m=%d: out[%d][%d] = %x, alone %x", m, i/s.n, i%s.n,
										math.Float32bits(out[i]), math.Float32bits(alone[i]))
								}
							}
						}
					})
				}
			}
		}
	})
}

func TestMatMulWorkSplitDoesNotChangeResults(t *testing.T) {
	// Large enough to be split across workers in chunks: the result must
	// equal the single-threaded one bit for bit.
	forEachISA(t, func(t *testing.T) {
		for _, dt := range dtypes {
			rng := rand.New(rand.NewPCG(7, 7))
			w, _ := randMat(rng, dt, 300, 260)
			x := randVec(rng, 11*260)
			p1, p2 := NewPool(1), NewPool(2)
			defer p1.Close()
			defer p2.Close()
			a, b := make([]float32, 11*300), make([]float32, 11*300)
			p1.MatMul(a, x, 11, w)
			p2.MatMul(b, x, 11, w)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("%s: element %d differs: 1 thread %g, 2 threads %g", dt, i, a[i], b[i])
				}
			}
			// One activation row (decode), split into fewer ranges.
			one := make([]float32, 300)
			p2.MatMul(one, x[:260], 1, w)
			for j := range one {
				if math.Float32bits(one[j]) != math.Float32bits(a[j]) {
					t.Fatalf("%s: one row on 2 threads, element %d: %g, 1 thread %g", dt, j, one[j], a[j])
				}
			}
		}
	})
}

func TestMatMulPanicsOnShortSlices(t *testing.T) {
	w := &Mat{DType: BF16, Rows: 4, Cols: 8, U16: make([]uint16, 32)}
	pool := NewPool(1)
	defer pool.Close()
	cases := []struct {
		name   string
		out, x []float32
		m      int
		w      *Mat
	}{
		{"short x", make([]float32, 8), make([]float32, 15), 2, w},
		{"short out", make([]float32, 7), make([]float32, 16), 2, w},
		{"short weights", make([]float32, 8), make([]float32, 16), 2, &Mat{DType: BF16, Rows: 4, Cols: 8, U16: make([]uint16, 31)}},
		{"f32 weights missing", make([]float32, 8), make([]float32, 16), 2, &Mat{DType: F32, Rows: 4, Cols: 8}},
		{"negative m", make([]float32, 8), make([]float32, 16), -1, w},
		{"unknown dtype", make([]float32, 8), make([]float32, 16), 2, &Mat{DType: 9, Rows: 4, Cols: 8}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("MatMul did not panic")
				}
			}()
			pool.MatMul(c.out, c.x, c.m, c.w)
		})
	}
}

func TestSetISARejectsUnknownNames(t *testing.T) {
	if err := SetISA("sse9"); err == nil {
		t.Fatal("SetISA(sse9) succeeded")
	}
	if got := ISAs(); len(got) == 0 || got[len(got)-1] != "go" {
		t.Fatalf("ISAs() = %v, want a list ending in go", got)
	}
}

func TestMatMulColumnsDoNotDependOnTheirWeightRowGroup(t *testing.T) {
	// Kernels process several weight rows per pass and the remainder one
	// at a time: an output column must come out the same either way, so
	// compare each column with the product by its weight row alone.
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		for _, dt := range dtypes {
			// n = 19 and 20 end the 4×3 tiles of the AVX2 kernels with one
			// and two rows left; m = 6 and 7 run the 4-row kernel, then the
			// 2- and 3-row ones.
			for _, c := range []struct{ k, n, m int }{{8, 19, 6}, {33, 19, 6}, {172, 19, 6}, {576, 19, 6}, {33, 20, 7}, {172, 20, 7}, {576, 20, 7}} {
				k, n, m := c.k, c.n, c.m
				rng := rand.New(rand.NewPCG(uint64(k), 11))
				w, _ := randMat(rng, dt, n, k)
				x := randVec(rng, m*k)
				full := make([]float32, m*n)
				pool.MatMul(full, x, m, w)
				for j := range n {
					row := &Mat{DType: dt, Rows: 1, Cols: k}
					if dt == F32 {
						row.F32 = w.F32[j*k : (j+1)*k]
					} else {
						row.U16 = w.U16[j*k : (j+1)*k]
					}
					one := make([]float32, m)
					pool.MatMul(one, x, m, row)
					for i := range m {
						if math.Float32bits(one[i]) != math.Float32bits(full[i*n+j]) {
							t.Fatalf("%s k=%d: out[%d][%d] = %g with all rows, %g with row %d alone", dt, k, i, j, full[i*n+j], one[i], j)
						}
					}
				}
			}
		}
	})
}

func TestMatMulSingleRowDoesNotDependOnItsWeightRowGroup(t *testing.T) {
	// The M = 1 kernels read several weight rows side by side (AVX2 bf16
	// and f32: 8 streams of n/8 rows each, then 4 rows, then one at a
	// time), with other register layouts than the multi-row kernels: every
	// column of a single-row product must equal the product by its weight
	// row alone, for every count of rows (each split into the passes, up
	// to 5 rows a stream) and K with and without a tail.
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		for _, dt := range dtypes {
			for _, k := range []int{8, 15, 64, 203} {
				rng := rand.New(rand.NewPCG(uint64(k), 29))
				const maxN = 47
				w, _ := randMat(rng, dt, maxN, k)
				x := randVec(rng, k)
				alone := make([]float32, maxN)
				for j := range maxN {
					row := &Mat{DType: dt, Rows: 1, Cols: k}
					if dt == F32 {
						row.F32 = w.F32[j*k : (j+1)*k]
					} else {
						row.U16 = w.U16[j*k : (j+1)*k]
					}
					pool.MatMul(alone[j:j+1], x, 1, row)
				}
				for n := 1; n <= maxN; n++ {
					sub := &Mat{DType: dt, Rows: n, Cols: k}
					if dt == F32 {
						sub.F32 = w.F32[:n*k]
					} else {
						sub.U16 = w.U16[:n*k]
					}
					out := make([]float32, n)
					pool.MatMul(out, x, 1, sub)
					for j := range n {
						if math.Float32bits(out[j]) != math.Float32bits(alone[j]) {
							t.Fatalf("%s k=%d n=%d: out[%d] = %g, %g with its row alone", dt, k, n, j, out[j], alone[j])
						}
					}
				}
			}
		}
	})
}
