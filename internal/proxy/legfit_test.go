package proxy

import (
	"math"
	"testing"
)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*max(math.Abs(want), 1e-12) }

func TestFitCurveRecoversAQuadratic(t *testing.T) {
	want := prefillCurve{A: 0.004, B: 0.0003, C: 2e-7}
	var n, s []float64
	for tokens := 32.0; tokens <= 2048; tokens *= 1.5 {
		n, s = append(n, tokens), append(s, want.seconds(tokens))
	}
	got, ok := fitCurve(n, s)
	if !ok || !near(got.A, want.A, 1e-6) || !near(got.B, want.B, 1e-6) || !near(got.C, want.C, 1e-6) {
		t.Errorf("fit %+v ok=%v, want %+v", got, ok, want)
	}
}

// TestFitCurveIsNonNegative: points a line with a negative intercept would
// fit best are fitted with every coefficient non-negative, the best such.
func TestFitCurveIsNonNegative(t *testing.T) {
	n := []float64{100, 200, 300, 400}
	s := []float64{0.01, 0.03, 0.05, 0.07} // 0.0002·n − 0.01
	got, ok := fitCurve(n, s)
	if !ok || got.A < 0 || got.B < 0 || got.C < 0 {
		t.Fatalf("fit %+v ok=%v: want every coefficient non-negative", got, ok)
	}
	// Without an intercept, the best fit of a convex shape through the
	// origin: a curve that passes near every point.
	for i := range n {
		if d := math.Abs(got.seconds(n[i]) - s[i]); d > 0.006 {
			t.Errorf("at %v tokens the fit gives %.4f, the point is %.4f", n[i], got.seconds(n[i]), s[i])
		}
	}
	if got.A != 0 {
		t.Errorf("intercept %v, want 0 (the unconstrained one is negative)", got.A)
	}
}

func TestFitCurveOneLength(t *testing.T) {
	// One length: every subset with two terms is singular; one term fits.
	got, ok := fitCurve([]float64{256, 256, 256}, []float64{0.1, 0.1, 0.1})
	if !ok || !near(got.seconds(256), 0.1, 1e-9) {
		t.Errorf("fit %+v ok=%v, want one through 0.1 s at 256", got, ok)
	}
	if _, ok := fitCurve(nil, nil); ok {
		t.Error("a fit of no points")
	}
}
