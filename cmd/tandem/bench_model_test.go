package main

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestBenchModelPrintsEveryFormatBesideTheLimits runs `tandem bench model`
// on a tiny shape: the read limit, the arithmetic peaks this CPU has, and a
// row per format whose prefill is a finite positive % of the peak of the
// instruction its kernels use (where there are assembly kernels).
func TestBenchModelPrintsEveryFormatBesideTheLimits(t *testing.T) {
	f := benchModelFlags{threads: 1, layers: 1, hidden: 256, kv: 256, ffn: 512, vocab: 1000, tokens: 4, reps: 1, readMiB: 1}
	dts := []tensor.DType{tensor.BF16, tensor.F32, tensor.Q8_0, tensor.Q4_K}
	var out bytes.Buffer
	cal := tensor.Calibration{Set: tensor.ISA(), Quant: tensor.QuantKernels(), Source: "test"}
	if err := benchModel(&out, f, dts, cal); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	want := []string{"read limit (stream read of 1 MiB, 1 threads):", "plain Go scans: words", "f32 MatMul in cache",
		"% of read limit", "prefill kernels' peak", "% of that peak"}
	for _, pk := range tensor.Peaks {
		if pk.Available() {
			want = append(want, pk.String()+": ")
		}
	}
	if !tensor.PeakFMA256.Available() {
		want = append(want, "arithmetic peaks: not measured")
	}
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("output lacks %q:\n%s", w, s)
		}
	}
	rows := map[string][]string{}
	for line := range strings.SplitSeq(s, "\n") {
		if fields := strings.Fields(line); len(fields) == 9 {
			rows[fields[0]] = fields
		}
	}
	for _, dt := range dts {
		row := rows[dt.String()]
		if row == nil {
			t.Errorf("no row of nine columns for %s:\n%s", dt, s)
			continue
		}
		for _, c := range []int{1, 2, 3} { // decode, the read beside it, their ratio
			if v, err := strconv.ParseFloat(strings.TrimSuffix(row[c], "%"), 64); err != nil || math.IsInf(v, 0) || math.IsNaN(v) || v <= 0 {
				t.Errorf("%s: column %d is %q, want a finite positive number", dt, c+1, row[c])
			}
		}
		pk, ok := tensor.PrefillPeak(cal.Set, cal.Quant, dt)
		if !ok || !pk.Available() {
			if row[6] != "-" || row[7] != "-" {
				t.Errorf("%s: no peak measured for its kernels, yet the row shows %s %s", dt, row[6], row[7])
			}
			continue
		}
		if row[6] != peakLabels[pk] {
			t.Errorf("%s: peak %s, want %s (the %s kernels')", dt, row[6], peakLabels[pk], pk)
		}
		pct, err := strconv.ParseFloat(strings.TrimSuffix(row[7], "%"), 64)
		if err != nil || math.IsInf(pct, 0) || math.IsNaN(pct) || pct <= 0 {
			t.Errorf("%s: %% of peak %q, want a finite positive percentage", dt, row[7])
		}
	}
}

func TestBenchModelRejectsBadShapes(t *testing.T) {
	for _, args := range [][]string{{"--hidden", "100"}, {"--formats", "q9"}, {"--threads", "0"}} {
		if err := runBenchModel(args); err == nil {
			t.Errorf("bench model %v: no error", args)
		}
	}
}

// TestPairedMediansRatioIsPassByPass: pairedMedians times fn right after b
// each round and takes the median of each round's ratio, not the ratio of
// the two medians, which come from different rounds.
func TestPairedMediansRatioIsPassByPass(t *testing.T) {
	var now time.Duration
	defer func(c func() time.Duration) { benchClock = c }(benchClock)
	benchClock = func() time.Duration { return now }
	bs := []time.Duration{10, 30, 20, 50, 40}
	fns := []time.Duration{40, 30, 80, 50, 40} // ratios b/fn: 1/4, 1, 1/4, 1, 1
	round := -1                                // the warm-up b pass comes first
	b := func() {
		if round++; round > 0 {
			now += bs[round-1]
		}
	}
	fn := func() { now += fns[round-1] }
	tfn, tb, ratio := pairedMedians(len(bs), fn, b)
	// The ratio of the medians would be 30/40.
	if tfn != 40 || tb != 30 || ratio != 1 {
		t.Fatalf("pairedMedians = %v, %v, %v; want the medians 40 and 30 and the median ratio 1", tfn, tb, ratio)
	}
}
