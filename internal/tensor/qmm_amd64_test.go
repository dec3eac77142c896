package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
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

// TestVBMIRowKernelsMatchTheDefinition runs the AVX512-VBMI row kernels of
// Q4_0 and Q5_0 (the quad kernels, for rows of a multiple of 4 blocks) and
// the AVX512-VNNI ones they replace side by side on random weight bytes
// (every nibble and fifth-bit pattern, sane f16 scales): both must give the
// definition's bits, for block counts where the last group of 8 overlaps
// the one before and row counts around one call's 8.
func TestVBMIRowKernelsMatchTheDefinition(t *testing.T) {
	if !cpu.X86.HasAVX512VBMI || !cpu.X86.HasAVX512VNNI {
		t.Skip("the CPU lacks AVX512-VBMI")
	}
	for _, d := range []DType{Q4_0, Q5_0} {
		rk := qKernelsAVX512.row[d]
		if rk.quad == nil {
			t.Fatalf("%s: no VBMI row kernel installed on a CPU with AVX512-VBMI", d)
		}
		plain := rk
		plain.quad = nil
		elems, bytes := d.BlockSize()
		for _, nb := range []int{8, 12, 16, 20, 28, 40, 64} {
			k := nb * elems
			for _, n := range []int{1, 7, 8, 9, 23} {
				rng := rand.New(rand.NewPCG(uint64(nb), uint64(n)))
				w := randQuantMat(t, rng, d, n, k)
				for i := range w.Q {
					w.Q[i] = byte(rng.Uint32())
				}
				for b := 0; b < len(w.Q); b += bytes {
					binary.LittleEndian.PutUint16(w.Q[b:], F32ToF16(float32(rng.Float64()+0.01)))
				}
				x := randVec(rng, k)
				a := new(qAct)
				pool := NewPool(1)
				pool.quantizeActs(active.Load(), a, d, x, 1, k)
				pool.Close()
				a.setRowAux()
				xq, xs := refActs(d, x)
				for _, kern := range []struct {
					name string
					rk   qRowKernel
				}{{"vbmi", rk}, {"vnni", plain}} {
					out := make([]float32, n)
					qKernelsAVX512.runRows(kern.rk, new(qScratch), a, w, 0, n, out)
					for j := range n {
						def, _, _ := refQuantDot(w, xq, xs, j)
						if math.Float32bits(out[j]) != math.Float32bits(def) {
							t.Fatalf("%s %s nb=%d n=%d: out[%d] = %g (%#x), the definition gives %g (%#x)", d, kern.name, nb, n, j, out[j], math.Float32bits(out[j]), def, math.Float32bits(def))
						}
					}
				}
			}
		}
	}
}
