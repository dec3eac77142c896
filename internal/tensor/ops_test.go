package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

func TestDotAndAxpyMatchFloat64Reference(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for n := 0; n <= 140; n++ {
			a, b := randVec(rng, n), randVec(rng, n+3) // b longer than a is allowed
			var ref, mag float64
			for i := range n {
				ref += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			if got := Dot(a, b); math.Abs(float64(got)-ref) > 1e-6*mag+1e-30 {
				t.Fatalf("Dot n=%d = %g, want %g", n, got, ref)
			}
			if Dot(a, b) != Dot(a, b) {
				t.Fatalf("Dot n=%d is not deterministic", n)
			}

			alpha := rng.Float32()*2 - 1
			y := randVec(rng, n+2)
			want := make([]float64, len(y))
			for i := range y {
				want[i] = float64(y[i])
				if i < n {
					want[i] += float64(alpha) * float64(a[i])
				}
			}
			Axpy(alpha, a, y)
			for i := range y {
				if math.Abs(float64(y[i])-want[i]) > 1e-6*(math.Abs(want[i])+1) {
					t.Fatalf("Axpy n=%d: y[%d] = %g, want %g", n, i, y[i], want[i])
				}
			}
		}
	})
}

func TestVectorOpsPanicOnShortOperands(t *testing.T) {
	cases := map[string]func(){
		"Dot":     func() { Dot(make([]float32, 3), make([]float32, 2)) },
		"Axpy":    func() { Axpy(1, make([]float32, 3), make([]float32, 2)) },
		"RMSNorm": func() { RMSNorm(make([]float32, 3), make([]float32, 3), make([]float32, 2), 1e-5) },
		"SiLUMul": func() { SiLUMul(make([]float32, 3), make([]float32, 2)) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("%s did not panic", name)
				}
			}()
			f()
		})
	}
}

func TestElementwiseOpsMatchFloat64Reference(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{1, 7, 8, 64, 172, 576} {
			t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
				x, w := randVec(rng, n), randVec(rng, n)
				for i := range x {
					x[i] *= 8
				}

				out := make([]float32, n)
				RMSNorm(out, x, w, 1e-5)
				var ss float64
				for _, v := range x {
					ss += float64(v) * float64(v)
				}
				inv := 1 / math.Sqrt(ss/float64(n)+1e-5)
				for i := range x {
					want := float64(x[i]) * inv * float64(w[i])
					if math.Abs(float64(out[i])-want) > 1e-5*(math.Abs(want)+1e-3) {
						t.Fatalf("RMSNorm[%d] = %g, want %g", i, out[i], want)
					}
				}

				gate := append([]float32(nil), x...)
				SiLUMul(gate, w)
				for i, g := range x {
					want := float64(g) / (1 + math.Exp(-float64(g))) * float64(w[i])
					if math.Abs(float64(gate[i])-want) > 1e-5*(math.Abs(want)+1e-6) {
						t.Fatalf("SiLUMul[%d] = %g, want %g", i, gate[i], want)
					}
				}

				p := append([]float32(nil), x...)
				Softmax(p)
				mx := math.Inf(-1)
				for _, v := range x {
					mx = math.Max(mx, float64(v))
				}
				var sum float64
				for _, v := range x {
					sum += math.Exp(float64(v) - mx)
				}
				for i, v := range x {
					want := math.Exp(float64(v)-mx) / sum
					if math.Abs(float64(p[i])-want) > 1e-5*want+1e-12 {
						t.Fatalf("Softmax[%d] = %g, want %g", i, p[i], want)
					}
				}
			})
		}
	})
}

func TestSoftmaxHandlesExtremes(t *testing.T) {
	x := []float32{float32(math.Inf(-1)), 0, -1000, 80}
	Softmax(x)
	if x[0] != 0 || x[2] != 0 || x[3] != 1 || x[1] <= 0 || x[1] > 2e-35 {
		t.Fatalf("Softmax(-inf, 0, -1000, 80) = %v", x)
	}
	Softmax(nil) // must not panic
}

func TestExpfIsAccurate(t *testing.T) {
	worst := 0.0
	for x := float32(-104); x < 89; x += 0.000731 {
		got := float64(expf(x))
		want := math.Exp(float64(x))
		if want < math.SmallestNonzeroFloat32 {
			continue
		}
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1)))) - float64(float32(want))
		if want < 1.2e-38 { // subnormal: absolute ulp
			ulp = math.SmallestNonzeroFloat32
		}
		if e := math.Abs(got-want) / ulp; e > worst {
			worst = e
			if e > 2 {
				t.Fatalf("expf(%g) = %g, want %g (%.2f ulp)", x, got, want, e)
			}
		}
	}
	for _, c := range []struct{ x, want float32 }{
		{float32(math.Inf(1)), float32(math.Inf(1))}, {float32(math.Inf(-1)), 0}, {89, float32(math.Inf(1))}, {-200, 0}, {0, 1},
	} {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Errorf("expf(NaN) = %g, want NaN", got)
	}
	t.Logf("worst error %.2f ulp", worst)
}

func TestConversionsRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		b := uint16(h)
		f := BF16ToF32(b)
		if f == f && F32ToBF16(f) != b {
			t.Fatalf("bf16 %#04x -> %g -> %#04x", b, f, F32ToBF16(f))
		}
		g := F16ToF32(b)
		if g != g {
			if back := F16ToF32(F32ToF16(g)); back == back {
				t.Fatalf("f16 NaN %#04x did not stay NaN", b)
			}
			continue
		}
		if F32ToF16(g) != b {
			t.Fatalf("f16 %#04x -> %g -> %#04x", b, g, F32ToF16(g))
		}
	}
}

func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	check := func(f float32) {
		h := F32ToF16(f)
		got := float64(F16ToF32(h))
		d := math.Abs(got - float64(f))
		for _, nb := range []uint16{h - 1, h + 1} {
			if nb&0x7c00 == 0x7c00 && nb&0x3ff != 0 || nb>>15 != h>>15 {
				continue // NaN or other sign
			}
			dn := math.Abs(float64(F16ToF32(nb)) - float64(f))
			if dn < d || (dn == d && h&1 == 1) {
				t.Fatalf("F32ToF16(%g) = %#04x (%g), neighbour %#04x (%g) is nearer or even", f, h, got, nb, F16ToF32(nb))
			}
		}
	}
	for range 200000 {
		e := rng.IntN(40) - 27 // 2^-27 .. 2^12: subnormals, normals
		check(float32(math.Ldexp(rng.Float64()*2-1, e)))
	}
	for h := range uint16(0x7bff) { // exact midpoints between neighbours
		mid := (float64(F16ToF32(h)) + float64(F16ToF32(h+1))) / 2
		check(float32(mid))
	}
	if F32ToF16(70000) != 0x7c00 || F32ToF16(-70000) != 0xfc00 || F32ToF16(65519) != 0x7bff || F32ToF16(65520) != 0x7c00 {
		t.Fatal("F32ToF16 overflow handling")
	}
	for _, b := range []float32{0.5, 1.5, -3.25} { // exactly representable in bf16
		if BF16ToF32(F32ToBF16(b)) != b {
			t.Fatalf("bf16 round trip of %g", b)
		}
	}
	if F32ToBF16(1+1.0/256) != 0x3f80 || F32ToBF16(1+3.0/256) != 0x3f82 { // ties to even
		t.Fatal("F32ToBF16 ties")
	}
}

func TestElementwiseResultsDoNotDependOnPosition(t *testing.T) {
	// SiLUMul's vector body and its partial-vector tail must compute the
	// same function, so an element's result cannot depend on where it sits.
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(8, 9))
		g, u := randVec(rng, 100), randVec(rng, 100)
		for i := range g {
			g[i] *= 20
		}
		whole := append([]float32(nil), g...)
		SiLUMul(whole, u)
		for _, off := range []int{0, 1, 5, 17, 99} {
			for _, n := range []int{1, 3, 16, 33} {
				if off+n > len(g) {
					continue
				}
				part := append([]float32(nil), g[off:off+n]...)
				SiLUMul(part, u[off:off+n])
				for i := range part {
					if math.Float32bits(part[i]) != math.Float32bits(whole[off+i]) {
						t.Fatalf("SiLUMul element %d: %g alone at offset %d, %g in the whole row", off+i, part[i], i, whole[off+i])
					}
				}
			}
		}
	})
}

func TestVectorExpMatchesMath(t *testing.T) {
	// Softmax of {v, 0} is e^v/(e^v+1): with v ≤ 0 the sum is within half
	// an ulp, so this checks the vector exponential over the range that
	// matters, to a few ulp.
	forEachISA(t, func(t *testing.T) {
		for v := float32(-100); v <= 0; v += 0.0173 {
			x := []float32{v, 0}
			Softmax(x)
			ev := math.Exp(float64(v))
			want := ev / (1 + ev)
			if math.Abs(float64(x[0])-want) > 4e-7*want+2e-45 { // subnormals: absolute
				t.Fatalf("Softmax({%g, 0})[0] = %g, want %g", v, x[0], want)
			}
		}
	})
}

func TestAxpyRowsMatchesAxpyCalls(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 5))
		for _, n := range []int{1, 7, 16, 17, 63, 64, 65, 100, 128, 130} {
			for _, rows := range []int{0, 1, 2, 5, 16} {
				ldv := n + 3
				v := randVec(rng, rows*ldv+1)
				alpha := randVec(rng, rows)
				y0 := randVec(rng, n)
				want := append([]float32(nil), y0...)
				for r := range rows {
					Axpy(alpha[r], v[r*ldv:r*ldv+n], want)
				}
				got := append([]float32(nil), y0...)
				AxpyRows(got, alpha, v, ldv)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d rows=%d: y[%d] = %g, Axpy calls give %g", n, rows, i, got[i], want[i])
					}
				}
			}
		}
	})
}

func TestDotRowsMatchesMatMul(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		rng := rand.New(rand.NewPCG(6, 6))
		for _, k := range []int{1, 8, 16, 33, 64, 100} {
			for _, n := range []int{1, 3, 8, 13, 16, 37} {
				ldw := k + 5
				w := randVec(rng, n*ldw)
				x := randVec(rng, 3*k)
				dense := make([]float32, n*k)
				for j := range n {
					copy(dense[j*k:(j+1)*k], w[j*ldw:])
				}
				want := make([]float32, 3*n)
				pool.MatMul(want, x, 3, &Mat{DType: F32, Rows: n, Cols: k, F32: dense})
				for i := range 3 {
					got := make([]float32, n)
					DotRows(got, x[i*k:(i+1)*k], w, ldw)
					for j := range got {
						if math.Float32bits(got[j]) != math.Float32bits(want[i*n+j]) {
							t.Fatalf("k=%d n=%d: row %d out[%d] = %g, MatMul gives %g", k, n, i, j, got[j], want[i*n+j])
						}
					}
				}
			}
		}
	})
}

// TestBF16ActivationRounding checks the kernels that round activations to
// bf16 against F32ToBF16 (nearest even) on every length up to 40 (full
// vectors and masked tails) and on special values.
func TestBF16ActivationRounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	specials := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.00390625, 1.01171875, 1.0039063, 1.0039062,
		float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32 * (1 << 23),
		3.0e38, 65504, 1e-30}
	for _, ks := range kernelSets {
		if !ks.avail || ks.toBF16 == nil {
			continue
		}
		t.Run(ks.name, func(t *testing.T) {
			for n := 0; n <= 40; n++ {
				x := make([]float32, n)
				for i := range x {
					x[i] = (rng.Float32()*2 - 1) * float32(math.Pow(2, float64(rng.IntN(40)-20)))
				}
				copy(x, specials[:min(n, len(specials))])
				out := make([]uint16, n+1)
				out[n] = 0xdead // must not be written
				if n > 0 {
					ks.toBF16(&x[0], &out[0], n)
				}
				for i, v := range x {
					if want := F32ToBF16(v); out[i] != want {
						t.Fatalf("n=%d: bf16(%g) = %#04x, want %#04x", n, v, out[i], want)
					}
				}
				if out[n] != 0xdead {
					t.Fatalf("n=%d: wrote past the end", n)
				}
			}
			nan := make([]uint16, 1)
			ks.toBF16(new(float32(math.NaN())), &nan[0], 1)
			if v := BF16ToF32(nan[0]); !math.IsNaN(float64(v)) {
				t.Errorf("bf16(NaN) = %g", v)
			}
		})
	}
}

func TestAxpyRowsBF16MatchesWidenedAxpyRows(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 7))
		for _, n := range []int{1, 7, 16, 17, 63, 64, 65, 100, 128, 130} {
			for _, rows := range []int{0, 1, 2, 5, 16} {
				ldv := n + 3
				v := make([]uint16, rows*ldv+1)
				wide := make([]float32, len(v))
				for i := range v {
					v[i] = F32ToBF16(rng.Float32()*2 - 1)
					wide[i] = BF16ToF32(v[i])
				}
				alpha := randVec(rng, rows)
				y0 := randVec(rng, n)
				want := append([]float32(nil), y0...)
				AxpyRows(want, alpha, wide, ldv)
				got := append([]float32(nil), y0...)
				AxpyRowsBF16(got, alpha, v, ldv)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d rows=%d: y[%d] = %g, widened AxpyRows gives %g", n, rows, i, got[i], want[i])
					}
				}
			}
		}
	})
}

func TestDotRowsBF16MatchesMatMul(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		pool := NewPool(1)
		defer pool.Close()
		rng := rand.New(rand.NewPCG(8, 8))
		for _, k := range []int{1, 8, 16, 33, 64, 100, 300} {
			for _, n := range []int{1, 3, 8, 13, 16, 37} {
				ldw := k + 5
				w := make([]uint16, n*ldw)
				for i := range w {
					w[i] = F32ToBF16(rng.Float32()*2 - 1)
				}
				const m = 7
				x := randVec(rng, m*k)
				dense := make([]uint16, n*k)
				for j := range n {
					copy(dense[j*k:(j+1)*k], w[j*ldw:])
				}
				want := make([]float32, m*n)
				pool.MatMul(want, x, m, &Mat{DType: BF16, Rows: n, Cols: k, U16: dense})
				var q BF16Query
				// Every group of consecutive query rows, 1 to 6 at a time.
				for rows := 1; rows <= 6; rows++ {
					for r0 := 0; r0+rows <= m; r0++ {
						ldo := n + 2
						got := make([]float32, rows*ldo)
						q.Set(x[r0*k:], rows, k)
						DotRowsBF16(got, ldo, &q, w, ldw, n)
						for r := range rows {
							for j := range n {
								if math.Float32bits(got[r*ldo+j]) != math.Float32bits(want[(r0+r)*n+j]) {
									t.Fatalf("k=%d n=%d rows=%d: row %d out[%d] = %g, MatMul gives %g", k, n, rows, r0+r, j, got[r*ldo+j], want[(r0+r)*n+j])
								}
							}
						}
					}
				}
			}
		}
	})
}

func TestAxpyRowsBF16GroupMatchesSeparateCalls(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 11))
		for _, g := range []int{1, 2, 3, 4, 5, 7} {
			for _, n := range []int{1, 16, 17, 48, 64, 65, 130} {
				for _, rows := range []int{1, 2, 16} {
					ldv, ldy, lda := n+3, n+1, rows+2
					v := make([]uint16, rows*ldv)
					for i := range v {
						v[i] = F32ToBF16(rng.Float32()*2 - 1)
					}
					alpha := randVec(rng, g*lda)
					y0 := randVec(rng, g*ldy)
					want := append([]float32(nil), y0...)
					for h := range g {
						AxpyRowsBF16(want[h*ldy:h*ldy+n], alpha[h*lda:h*lda+rows], v, ldv)
					}
					got := append([]float32(nil), y0...)
					AxpyRowsBF16Group(g, n, got, ldy, alpha, lda, rows, v, ldv)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("g=%d n=%d rows=%d: y[%d] = %g, separate calls give %g", g, n, rows, i, got[i], want[i])
						}
					}
				}
			}
		}
	})
}

func TestAxpyRowsGroupMatchesSeparateCalls(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(13, 13))
		for _, g := range []int{1, 2, 3, 4, 5, 7} {
			for _, n := range []int{1, 16, 17, 48, 64, 65, 130} {
				for _, rows := range []int{1, 2, 16} {
					ldv, ldy, lda := n+3, n+1, rows+2
					v := randVec(rng, rows*ldv)
					alpha := randVec(rng, g*lda)
					y0 := randVec(rng, g*ldy)
					want := append([]float32(nil), y0...)
					for h := range g {
						for r := range rows {
							Axpy(alpha[h*lda+r], v[r*ldv:r*ldv+n], want[h*ldy:h*ldy+n])
						}
					}
					got := append([]float32(nil), y0...)
					AxpyRowsGroup(g, n, got, ldy, alpha, lda, rows, v, ldv)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("g=%d n=%d rows=%d: y[%d] = %g, Axpy calls give %g", g, n, rows, i, got[i], want[i])
						}
					}
				}
			}
		}
	})
}

func TestStoreBF16MatchesF32ToBF16(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(12, 12))
		for _, n := range []int{0, 1, 15, 16, 32, 192, 200} {
			for _, off := range []int{0, 1, 16} { // 32-byte aligned, not, aligned again
				src := randVec(rng, n)
				buf := make([]uint16, n+off+16)
				base := (32 - int(uintptr(unsafe.Pointer(&buf[0]))%32)) % 32 / 2
				dst := buf[base+off:][:n]
				StoreBF16(dst, src)
				for i, v := range src {
					if dst[i] != F32ToBF16(v) {
						t.Fatalf("n=%d off=%d: StoreBF16(%g) = %#04x, want %#04x", n, off, v, dst[i], F32ToBF16(v))
					}
				}
			}
		}
	})
}

func TestToBF16MatchesF32ToBF16(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(10, 10))
		for _, n := range []int{0, 1, 15, 16, 17, 64, 192, 193} {
			src := randVec(rng, n)
			dst := make([]uint16, n)
			ToBF16(dst, src)
			for i, v := range src {
				if dst[i] != F32ToBF16(v) {
					t.Fatalf("n=%d: ToBF16(%g) = %#04x, want %#04x", n, v, dst[i], F32ToBF16(v))
				}
			}
		}
	})
}

func TestSumWordsAddsEveryWholeGroupOfWords(t *testing.T) {
	x := make([]float32, 2*8*3+5) // three groups of eight words, and a tail it skips
	for i := range x {
		x[i] = math.Float32frombits(uint32(i + 1))
	}
	var want uint64
	for i := 0; i < 2*8*3; i += 2 {
		want += uint64(i+1) | uint64(i+2)<<32
	}
	if got := SumWords(x); got != want {
		t.Fatalf("SumWords = %d, want %d", got, want)
	}
}
