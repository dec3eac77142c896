package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/cpu"
)

// BenchmarkQuantRowKernel reports the most weight bytes per second the
// row kernels (AVX512-VNNI where the CPU has it, and AVX2) reach on weights
// that stay in L2 (0.5 MiB), the best of many trials of 20 passes: their
// compute speed, robust to a machine other work shares (compare
// BenchmarkQuantMatMulCold for DRAM).
//
//	go test -run '^$' -bench QuantRowKernel -benchtime 3000x ./internal/tensor/
func BenchmarkQuantRowKernel(b *testing.B) {
	sets := []struct {
		name  string
		ks    *qKernelSet
		avail bool
	}{
		{"avx512vnni", qKernelsAVX512, cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512BW},
		{"avx2", qKernelsAVX2, cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C},
	}
	for _, set := range sets {
		for _, d := range []DType{Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
			for _, k := range []int{2048, 8192} {
				b.Run(fmt.Sprintf("%s/%s/K=%d", set.name, d, k), func(b *testing.B) {
					if !set.avail {
						b.Skip("the CPU lacks " + set.name)
					}
					n := (512 << 10) / k
					rng := rand.New(rand.NewPCG(1, 1))
					w := benchQuantMat(b, rng, d, n, k)
					pool := NewPool(1)
					defer pool.Close()
					a := new(qAct)
					pool.quantizeActs(active.Load(), a, d, randVec(rng, k), 1, k)
					a.setRowAux()
					out := make([]float32, n)
					rk := set.ks.row[d]
					sc := new(qScratch)
					best := time.Duration(1 << 62)
					for b.Loop() {
						t := time.Now()
						for range 20 {
							set.ks.runRows(rk, sc, a, w, 0, n, out)
						}
						best = min(best, time.Since(t))
					}
					b.ReportMetric(float64(20*len(w.Q))/best.Seconds()/1e9, "maxGB/s")
				})
			}
		}
	}
}
