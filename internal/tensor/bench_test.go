package tensor

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// benchShapes are the SmolLM2-135M projections (N×K) plus a 1B-class one.
var benchShapes = []struct{ n, k int }{{576, 576}, {1536, 576}, {576, 1536}, {2048, 2048}}

// BenchmarkMatMul reports GFLOP/s (2·M·N·K per call) on a weight matrix that
// stays cache-resident across iterations (prefill-like reuse), for every
// ISA this CPU supports.
//
//	go test -run '^$' -bench 'MatMul/avx512.*/bf16/576x576/M=(1|16)/' ./internal/tensor/
func BenchmarkMatMul(b *testing.B) {
	def := ISA()
	defer func() { _ = SetISA(def) }()
	for _, isa := range ISAs() {
		for _, dt := range []DType{F32, BF16} {
			for _, threads := range []int{1, 2} {
				pool := NewPool(threads)
				for _, s := range benchShapes {
					for _, m := range []int{1, 4, 16, 128} {
						name := fmt.Sprintf("%s/%s/%dx%d/M=%d/T=%d", isa, dt, s.n, s.k, m, threads)
						b.Run(name, func(b *testing.B) {
							if err := SetISA(isa); err != nil {
								b.Fatal(err)
							}
							rng := rand.New(rand.NewPCG(1, 1))
							w, _ := randMat(rng, dt, s.n, s.k)
							x := randVec(rng, m*s.k)
							out := make([]float32, m*s.n)
							if threads == 1 {
								runtime.LockOSThread()
								defer runtime.UnlockOSThread()
							}
							cpu0, cpuOK := threadCPU()
							for b.Loop() {
								pool.MatMul(out, x, m, w)
							}
							b.ReportMetric(2*float64(m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
							if cpu1, ok := threadCPU(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
								b.ReportMetric(2*float64(m*s.n*s.k)*float64(b.N)/(cpu1-cpu0).Seconds()/1e9, "cpuGFLOP/s")
							}
						})
					}
				}
				pool.Close()
			}
		}
	}
}

// BenchmarkMatMulColdBF16 reports the weight bytes streamed per second by
// MatMul over rotating bf16 matrices of ~320 MiB in all, far bigger than
// the caches, so the weights come from DRAM as in decode: square 2048×2048
// ones, and 3072×576 ones with the short (1152-byte) rows of the
// SmolLM2-135M projections; M=1 is single-stream decode, M=16 a batched
// decode step.
func BenchmarkMatMulColdBF16(b *testing.B) { benchMatMulCold(b, BF16) }

// BenchmarkMatMulColdF32 is BenchmarkMatMulColdBF16 with f32 weights (the
// short rows are 2,304 bytes).
func BenchmarkMatMulColdF32(b *testing.B) { benchMatMulCold(b, F32) }

// benchMatMulCold runs the cold MatMul benchmarks for weights of type dt
// (F32 or BF16).
func benchMatMulCold(b *testing.B, dt DType) {
	esize := 2
	if dt == F32 {
		esize = 4
	}
	for _, s := range []struct{ n, k int }{{2048, 2048}, {3072, 576}} {
		mats := (320 << 20) / (s.n * s.k * esize)
		rng := rand.New(rand.NewPCG(2, 2))
		ws := make([]*Mat, mats)
		for i := range ws {
			ws[i] = &Mat{DType: dt, Rows: s.n, Cols: s.k}
			if dt == F32 {
				ws[i].F32 = make([]float32, s.n*s.k)
				for j := range ws[i].F32 {
					ws[i].F32[j] = rng.Float32()*2 - 1
				}
				continue
			}
			ws[i].U16 = make([]uint16, s.n*s.k)
			for j := range ws[i].U16 {
				ws[i].U16[j] = uint16(rng.Uint32())&0x3fff | 0x3000 // finite values
			}
		}
		for _, m := range []int{1, 16} {
			x := randVec(rng, m*s.k)
			out := make([]float32, m*s.n)
			for _, threads := range []int{1, 2} {
				forBenchISAs(b, fmt.Sprintf("%dx%d/M=%d/T=%d", s.n, s.k, m, threads), func(b *testing.B) {
					pool := NewPool(threads)
					defer pool.Close()
					if threads == 1 {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
					}
					cpu0, cpuOK := threadCPU()
					i := 0
					for b.Loop() {
						pool.MatMul(out, x, m, ws[i%mats])
						i++
					}
					bytes := float64(s.n*s.k*esize) * float64(b.N)
					if cpu1, ok := threadCPU(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
						b.ReportMetric(bytes/(cpu1-cpu0).Seconds()/1e9, "cpuGB/s")
					}
					b.ReportMetric(bytes/b.Elapsed().Seconds()/1e9, "GB/s")
					b.ReportMetric(2*float64(m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// forBenchISAs runs f as sub-benchmark name/isa for every assembly ISA
// this CPU supports, so that kernel sets are compared within one run.
func forBenchISAs(b *testing.B, name string, f func(b *testing.B)) {
	def := ISA()
	defer func() { _ = SetISA(def) }()
	for _, isa := range ISAs() {
		if isa == "go" {
			continue
		}
		b.Run(name+"/"+isa, func(b *testing.B) {
			if err := SetISA(isa); err != nil {
				b.Fatal(err)
			}
			f(b)
		})
	}
}

// BenchmarkParallelOverhead measures one empty Parallel call on a pool whose
// workers are spinning (back-to-back kernels, as in the step loop).
func BenchmarkParallelOverhead(b *testing.B) {
	pool := NewPool(2)
	defer pool.Close()
	for b.Loop() {
		pool.Parallel(2, func(lo, hi int) {})
	}
}

// BenchmarkElementwise measures the per-token element-wise layers of the
// SmolLM2-135M shape.
func BenchmarkElementwise(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	x, w, out := randVec(rng, 576), randVec(rng, 576), make([]float32, 576)
	gate, up := randVec(rng, 1536), randVec(rng, 1536)
	scores := randVec(rng, 512)
	b.Run("RMSNorm/576", func(b *testing.B) {
		for b.Loop() {
			RMSNorm(out, x, w, 1e-5)
		}
	})
	b.Run("SiLUMul/1536", func(b *testing.B) {
		for b.Loop() {
			SiLUMul(gate, up)
		}
	})
	b.Run("Softmax/512", func(b *testing.B) {
		for b.Loop() {
			Softmax(scores)
		}
	})
	b.Run("Dot/64", func(b *testing.B) {
		for b.Loop() {
			sinkF = Dot(x[:64], w[:64])
		}
	})
	b.Run("Axpy/64", func(b *testing.B) {
		for b.Loop() {
			Axpy(0.5, x[:64], out[:64])
		}
	})
}

var sinkF float32

// quantBenchShapes are the llama-1b (q/o, k/v, gate/up, down) and
// smollm2-135m (q/o, k/v, gate/up, down) projections, N×K.
var quantBenchShapes = []struct {
	model string
	n, k  int
}{
	{"llama-1b", 2048, 2048}, {"llama-1b", 512, 2048}, {"llama-1b", 8192, 2048}, {"llama-1b", 2048, 8192},
	{"smollm2-135m", 576, 576}, {"smollm2-135m", 192, 576}, {"smollm2-135m", 1536, 576}, {"smollm2-135m", 576, 1536},
}

// benchQuantMat returns a quantized n×k matrix of random weights (its
// rows repeat a few random rows: quantizing is slow, the kernels do not
// care).
func benchQuantMat(b *testing.B, rng *rand.Rand, d DType, n, k int) *Mat {
	const distinct = 64
	src := randVec(rng, distinct*k)
	q, err := QuantizeRows(d, src, distinct, k)
	if err != nil {
		b.Fatal(err)
	}
	rb := len(q) / distinct
	w := &Mat{DType: d, Rows: n, Cols: k, Q: make([]byte, n*rb)}
	for j := range n {
		copy(w.Q[j*rb:], q[(j%distinct)*rb:(j%distinct+1)*rb])
	}
	return w
}

// BenchmarkQuantMatMul reports GFLOP/s (2·M·N·K per call) and the weight
// bytes read per second for Q8_0, Q4_0, Q4_K and Q6_K weights that stay cache-resident
// when they fit (see BenchmarkQuantMatMulCold for DRAM-bound decode), on
// every assembly ISA.
//
//	go test -run '^$' -bench 'QuantMatMul/q8_0/llama-1b/2048x2048/M=(1|16)/' ./internal/tensor/
func BenchmarkQuantMatMul(b *testing.B) {
	for _, d := range []DType{Q8_0, Q4_0, Q4_K, Q6_K} {
		for _, s := range quantBenchShapes {
			if _, err := d.RowBytes(s.k); err != nil {
				continue // smollm2's 576 columns are no multiple of 256
			}
			rng := rand.New(rand.NewPCG(1, 1))
			w := benchQuantMat(b, rng, d, s.n, s.k)
			for _, m := range []int{1, 16, 128} {
				x := randVec(rng, m*s.k)
				out := make([]float32, m*s.n)
				for _, threads := range []int{1, 2} {
					forBenchISAs(b, fmt.Sprintf("%s/%s/%dx%d/M=%d/T=%d", d, s.model, s.n, s.k, m, threads), func(b *testing.B) {
						pool := NewPool(threads)
						defer pool.Close()
						if threads == 1 {
							runtime.LockOSThread()
							defer runtime.UnlockOSThread()
						}
						cpu0, cpuOK := threadCPU()
						for b.Loop() {
							pool.MatMul(out, x, m, w)
						}
						sec := b.Elapsed().Seconds() / float64(b.N)
						b.ReportMetric(2*float64(m*s.n*s.k)/sec/1e9, "GFLOP/s")
						b.ReportMetric(float64(len(w.Q))/sec/1e9, "GB/s")
						if cpu1, ok := threadCPU(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
							b.ReportMetric(2*float64(m*s.n*s.k)*float64(b.N)/(cpu1-cpu0).Seconds()/1e9, "cpuGFLOP/s")
						}
					})
				}
			}
		}
	}
}

// BenchmarkQuantMatMulCold reports the weight bytes streamed per second
// over rotating quantized matrices of ~320 MiB in all, so that the weights
// come from DRAM as in decode (compare BenchmarkMatMulColdBF16).
func BenchmarkQuantMatMulCold(b *testing.B) {
	for _, d := range []DType{Q8_0, Q4_K, Q5_K, Q6_K} {
		for _, s := range []struct{ n, k int }{{2048, 2048}, {8192, 2048}, {576, 1536}} {
			rng := rand.New(rand.NewPCG(2, 2))
			rb, _ := d.RowBytes(s.k)
			mats := (320 << 20) / (s.n * rb)
			proto := benchQuantMat(b, rng, d, s.n, s.k)
			ws := make([]*Mat, mats)
			for i := range ws {
				ws[i] = &Mat{DType: d, Rows: s.n, Cols: s.k, Q: append([]byte(nil), proto.Q...)}
			}
			for _, m := range []int{1, 16} {
				x := randVec(rng, m*s.k)
				out := make([]float32, m*s.n)
				for _, threads := range []int{1, 2} {
					forBenchISAs(b, fmt.Sprintf("%s/%dx%d/M=%d/T=%d", d, s.n, s.k, m, threads), func(b *testing.B) {
						pool := NewPool(threads)
						defer pool.Close()
						if threads == 1 {
							runtime.LockOSThread()
							defer runtime.UnlockOSThread()
						}
						cpu0, cpuOK := threadCPU()
						i := 0
						for b.Loop() {
							pool.MatMul(out, x, m, ws[i%mats])
							i++
						}
						sec := b.Elapsed().Seconds() / float64(b.N)
						b.ReportMetric(float64(s.n*rb)/sec/1e9, "GB/s")
						b.ReportMetric(2*float64(m*s.n*s.k)/sec/1e9, "GFLOP/s")
						if cpu1, ok := threadCPU(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
							// Per CPU second of this thread: what the
							// kernel does when it is not descheduled.
							b.ReportMetric(float64(s.n*rb)*float64(b.N)/(cpu1-cpu0).Seconds()/1e9, "cpuGB/s")
						}
					})
				}
			}
		}
	}
}

// BenchmarkQuantizeActs reports activation values quantized per second
// (q8_0 blocks for Q8_0 weights, q8_K for Q4_K), on one thread.
func BenchmarkQuantizeActs(b *testing.B) {
	pool := NewPool(1)
	defer pool.Close()
	for _, d := range []DType{Q8_0, Q4_K} {
		for _, s := range []struct{ m, k int }{{1, 2048}, {128, 2048}} {
			b.Run(fmt.Sprintf("%s/M=%d/K=%d", d, s.m, s.k), func(b *testing.B) {
				x := randVec(rand.New(rand.NewPCG(4, 4)), s.m*s.k)
				var a qAct
				for b.Loop() {
					pool.quantizeActs(active.Load(), &a, d, x, s.m, s.k)
				}
				b.ReportMetric(float64(s.m*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
			})
		}
	}
}

// BenchmarkStreamRead is the reference for the cold benchmarks: the bytes
// per second a scan reads from DRAM over ~320 MiB of rotating 32 MiB
// chunks, on 1 and 2 threads: the read limit the decode kernels are
// measured against. The limit is the fastest of the read/s=S/pf=N scans
// (ReadScan: generated assembly that only loads and adds, S streams side
// by side, prefetching N bytes ahead, N = 0 for none); the older scans are kept for comparison:
// words (SumWords, eight 64-bit chains in Go), dot (Dot of the data with
// itself) and argmax (ArgMax: assembly with AVX-512, but a Go loop in the
// avx2 set, where it is bound by its arithmetic, ~5.8 GB/s on a Zen 2).
func BenchmarkStreamRead(b *testing.B) {
	const chunk = 8 << 20 // floats per call: 32 MiB
	big := randVec(rand.New(rand.NewPCG(5, 5)), 10*chunk)
	type scan struct {
		name string
		fn   func([]float32)
	}
	var scans []scan
	for _, st := range ReadScanStreams {
		for _, pf := range ReadScanDistances {
			scans = append(scans, scan{fmt.Sprintf("read/s=%d/pf=%d", st, pf), func(x []float32) { ReadScan(x, st, pf) }})
		}
	}
	scans = append(scans,
		scan{"dot", func(x []float32) { Dot(x, x) }},
		scan{"words", func(x []float32) { SumWords(x) }},
		scan{"argmax", func(x []float32) { ArgMax(x) }},
	)
	for _, scan := range scans {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/T=%d", scan.name, threads), func(b *testing.B) {
				pool := NewPool(threads)
				defer pool.Close()
				if threads == 1 {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
				}
				cpu0, cpuOK := threadCPU()
				i := 0
				for b.Loop() {
					part := big[(i%10)*chunk : (i%10+1)*chunk]
					pool.Parallel(threads, func(lo, hi int) {
						n := len(part) / threads
						scan.fn(part[lo*n : hi*n])
					})
					i++
				}
				b.ReportMetric(float64(4*chunk)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				if cpu1, ok := threadCPU(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
					b.ReportMetric(float64(4*chunk)*float64(b.N)/(cpu1-cpu0).Seconds()/1e9, "cpuGB/s")
				}
			})
		}
	}
}

// BenchmarkQuantizeRows reports weights quantized per second by the
// reference quantizers on one goroutine (QuantizeRows is safe to call
// from several at once, on disjoint rows).
func BenchmarkQuantizeRows(b *testing.B) {
	x := randVec(rand.New(rand.NewPCG(6, 6)), 16*2048)
	for _, d := range []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
		b.Run(d.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := QuantizeRows(d, x, 16, 2048); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(x))*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mweights/s")
		})
	}
}
