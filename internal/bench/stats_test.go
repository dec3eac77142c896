package bench

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestPercentileInterpolatesLikeNumpy(t *testing.T) {
	// Expected values from numpy.percentile(xs, p) (linear method).
	tests := []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"one value is every percentile", []float64{7}, 99, 7},
		{"median of an odd count", []float64{1, 2, 3, 4, 5}, 50, 3},
		{"median of an even count is the midpoint", []float64{1, 2, 3, 4}, 50, 2.5},
		{"p90 of 1..10", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9.1},
		{"p99 of 1..10", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 9.91},
		{"p0 is the minimum", []float64{3, 4, 9}, 0, 3},
		{"p100 is the maximum", []float64{3, 4, 9}, 100, 9},
		{"p25 between unequal neighbours", []float64{10, 20, 40, 80}, 25, 17.5},
		{"p out of range is clamped", []float64{3, 4, 9}, 150, 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.xs, tc.p); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(nil) = %v, want NaN", got)
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"unsorted input", []float64{4, 1, 3, 2},
			Summary{N: 4, Mean: 2.5, Std: math.Sqrt(1.25), Min: 1, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4}},
		{"constant", []float64{5, 5, 5}, Summary{N: 3, Mean: 5, Min: 5, P50: 5, P90: 5, P99: 5, Max: 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.xs...)
			got := Summarize(in)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("Summarize (-want +got):\n%s", diff)
			}
			if !cmp.Equal(in, tc.xs, cmpopts.EquateEmpty()) {
				t.Errorf("Summarize reordered its input: %v", in)
			}
		})
	}
}
