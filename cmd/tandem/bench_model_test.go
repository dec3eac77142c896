package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestBenchModelPrintsEveryFormatBesideTheLimits runs `tandem bench model`
// on a tiny shape: a row per format, and the two limits.
func TestBenchModelPrintsEveryFormatBesideTheLimits(t *testing.T) {
	f := benchModelFlags{threads: 1, layers: 1, hidden: 256, kv: 256, ffn: 512, vocab: 1000, tokens: 4, reps: 1, readMiB: 1}
	dts := []tensor.DType{tensor.BF16, tensor.F32, tensor.Q8_0, tensor.Q4_K}
	var out bytes.Buffer
	cal := tensor.Calibration{Set: tensor.ISA(), Quant: tensor.QuantKernels(), Source: "test"}
	if err := benchModel(&out, f, dts, cal); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"read limit (stream read of 1 MiB, 1 threads):", "plain Go scans: words", "f32 FMA peak", "% of read limit", "% of FMA peak"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	rows := map[string]bool{}
	for line := range strings.SplitSeq(s, "\n") {
		if fields := strings.Fields(line); len(fields) == 7 {
			rows[fields[0]] = true
		}
	}
	for _, dt := range dts {
		if !rows[dt.String()] {
			t.Errorf("no row of seven columns for %s:\n%s", dt, s)
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
