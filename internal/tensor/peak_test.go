package tensor

import (
	"math"
	"runtime"
	"testing"
)

// TestPeakKernelsDoTheArithmeticTheirRatesCount runs each peak kernel this
// CPU has a few passes with operands of 1: its accumulators then hold the
// multiply-adds it really did, which must be the count PeakOps reports.
func TestPeakKernelsDoTheArithmeticTheirRatesCount(t *testing.T) {
	measured := 0
	for _, p := range Peaks {
		t.Run(p.String(), func(t *testing.T) {
			if !p.Available() {
				if PeakOps(p, 10) != 0 {
					t.Errorf("PeakOps of an unavailable peak: want 0")
				}
				if _, ok := PeakRate(p); ok {
					t.Errorf("PeakRate of an unavailable peak: ok")
				}
				t.Skip("not on this CPU")
			}
			measured++
			for _, iters := range []int{0, 1, 7, 1000} {
				got := peakKernels[p].run(iters)
				want := PeakOps(p, iters) / 2
				if got != want {
					t.Errorf("%d passes: the accumulators sum to %v multiply-adds, PeakOps counts %v", iters, got, want)
				}
			}
			rate, ok := PeakRate(p)
			if !ok || math.IsInf(rate, 0) || math.IsNaN(rate) || rate <= 0 {
				t.Errorf("PeakRate = %v, %v: want a finite positive rate", rate, ok)
			}
			t.Logf("%.1f G operations/s on one thread", rate/1e9)
		})
	}
	if runtime.GOARCH == "amd64" && ISA() != "go" && measured == 0 {
		t.Error("an amd64 kernel set runs here but no peak kernel does")
	}
}

func TestPrefillPeakIsTheInstructionTheKernelsUse(t *testing.T) {
	for _, c := range []struct {
		set, quant string
		dt         DType
		want       Peak
		ok         bool
	}{
		{"avx512bf16", "avx512vnni", BF16, PeakBF16Dot, true},
		{"avx512bf16", "avx512vnni", F32, PeakFMA512, true},
		{"avx512bf16", "avx512vnni", F16, PeakFMA512, true},
		{"avx512bf16", "avx512vnni", Q4_K, PeakVNNI, true},
		{"avx512", "avx2", BF16, PeakFMA512, true},
		{"avx512", "avx2", Q8_0, PeakInt8AVX2, true},
		{"avx2", "avx2", BF16, PeakFMA256, true},
		{"amxbf16", "amx", BF16, PeakAMXBF16, true},
		{"amxbf16", "amx", F32, PeakFMA512, true},
		{"amxbf16", "amx", Q8_0, PeakAMXInt8, true},
		{"amxbf16", "amx", Q5_0, PeakAMXInt8, true},
		{"amxbf16", "amx", Q4_K, PeakAMXInt8, true},
		{"amxbf16", "amx", Q6_K, PeakAMXInt8, true},
		{"go", "go", F32, 0, false},
		{"go", "go", Q6_K, 0, false},
	} {
		got, ok := PrefillPeak(c.set, c.quant, c.dt)
		if got != c.want || ok != c.ok {
			t.Errorf("PrefillPeak(%s, %s, %s) = %s, %v; want %s, %v", c.set, c.quant, c.dt, got, ok, c.want, c.ok)
		}
	}
}

// BenchmarkPeak reports each peak this CPU has on one thread, as
// G operations a second (2 a multiply-add).
func BenchmarkPeak(b *testing.B) {
	for _, p := range Peaks {
		b.Run(p.String(), func(b *testing.B) {
			if !p.Available() {
				b.Skip("not on this CPU")
			}
			ops := 0.0
			for b.Loop() {
				ops += PeakOps(p, 1<<16)
			}
			b.ReportMetric(ops/b.Elapsed().Seconds()/1e9, "Gop/s")
		})
	}
}
