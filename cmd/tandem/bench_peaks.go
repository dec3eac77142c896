package main

import (
	"fmt"
	"io"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// peakLabels are the short names the table gives the peaks.
var peakLabels = map[tensor.Peak]string{
	tensor.PeakFMA256:   "fma-ymm",
	tensor.PeakFMA512:   "fma-zmm",
	tensor.PeakBF16Dot:  "bf16-dot",
	tensor.PeakVNNI:     "vnni",
	tensor.PeakInt8AVX2: "int8-avx2",
	tensor.PeakAMXBF16:  "amx-bf16",
	tensor.PeakAMXInt8:  "amx-int8",
}

// peakIters is the passes of a peak kernel one timed run makes on each
// thread: 4 Mi passes of 12 instructions, about 14 ms at one instruction
// a cycle and 3.5 GHz.
const peakIters = 4 << 20

// arithPeaks measures each tensor.Peak this CPU has on every thread of p
// at once, as the prefill products run: operations per second (2 a
// multiply-add), median of reps; 0 for those it has not.
func arithPeaks(p *tensor.Pool, reps int) map[tensor.Peak]float64 {
	rates := map[tensor.Peak]float64{}
	threads := p.Threads()
	for _, pk := range tensor.Peaks {
		if !pk.Available() {
			continue
		}
		ops := tensor.PeakOps(pk, peakIters)
		d := median(reps, func() {
			p.Parallel(threads, func(lo, hi int) {
				for range hi - lo {
					tensor.PeakOps(pk, peakIters)
				}
			})
		})
		rates[pk] = ops * float64(threads) / d.Seconds()
	}
	return rates
}

// printPeaks prints the measured peaks, one a line.
func printPeaks(w io.Writer, rates map[tensor.Peak]float64, threads int) {
	if len(rates) == 0 {
		fmt.Fprintln(w, "arithmetic peaks: not measured (no assembly kernels for this CPU)")
		return
	}
	fmt.Fprintf(w, "arithmetic peaks (register-only loops, %d threads; a multiply-add counts 2 operations):\n", threads)
	for _, pk := range tensor.Peaks {
		if r, ok := rates[pk]; ok {
			unit := "GFLOP/s"
			if pk == tensor.PeakVNNI || pk == tensor.PeakInt8AVX2 || pk == tensor.PeakAMXInt8 {
				unit = "G int8 op/s"
			}
			fmt.Fprintf(w, "  %-9s %s: %.0f %s\n", peakLabels[pk], pk, r/1e9, unit)
		}
	}
}
