package planner

import (
	"math"
	"testing"
)

// TestDecodeStepFromNarrowBatchesFollowsThePrior: a lightly loaded decode
// measures batches 1–2 only (the simulated engine's 6.9 and 9.3 ms at
// context 128, wall clock at --sim-speed 4). A line through them predicts
// 10.8 ms at batch 16, nearly three times the engine's 4.7 ms; the prior's
// shape scaled to them predicts within a third of it.
func TestDecodeStepFromNarrowBatchesFollowsThePrior(t *testing.T) {
	ks := []float64{1, 1.5, 2, 1.2, 1.8}
	var tpots []float64
	for _, k := range ks {
		tpots = append(tpots, (6.86+2.45*(k-1))/4) // the engine between batches 1 and 2
	}
	kind, a, b, p, _ := fitDecodeCurve(ks, tpots)
	f := Fit{StepA: a, StepB: b, StepP: p}
	at16, want := f.stepMs(16), 18.63/4
	if kind != "prior" || math.Abs(at16-want) > want/3 {
		t.Fatalf("%s fit %.2f + %.2f·k^%.2f: %.1f ms at batch 16, want the prior's shape within a third of the engine's %.1f", kind, a, b, p, at16, want)
	}
	if got := f.batchAtSLO(f.stepMs(16), 0.5, 64); math.Abs(got-16) > 1e-6 {
		t.Fatalf("batch at the step of 16: %v, want 16 (the curve solved for k)", got)
	}
}

// TestDecodeStepRefitsFromWideBatches: batches that span the range fit
// the exponent too (here a concave 2 + 3·√k).
func TestDecodeStepRefitsFromWideBatches(t *testing.T) {
	var ks, tpots []float64
	for k := 1.0; k <= 32; k *= 1.5 {
		ks = append(ks, k)
		tpots = append(tpots, 2+3*math.Sqrt(k))
	}
	kind, a, b, p, _ := fitDecodeCurve(ks, tpots)
	if kind != "fit" || math.Abs(a-2) > 1e-6 || math.Abs(b-3) > 1e-6 || math.Abs(p-0.5) > 1e-9 {
		t.Fatalf("%s fit %v + %v·k^%v, want 2 + 3·k^0.5", kind, a, b, p)
	}
}

// TestDecodeStepSpreadIgnoresStalledWindows: a few scrape windows whose
// steps carried long local prefills sit far above the curve. The stall
// model counts those; as step noise they would leave no batch within the
// TPOT objective.
func TestDecodeStepSpreadIgnoresStalledWindows(t *testing.T) {
	var ks, tpots []float64
	for i := range 20 {
		k := float64(1 + i%8)
		ks = append(ks, k)
		tpot := 2 + 0.5*k + 0.1*float64(i%3-1)
		if i%7 == 3 {
			tpot += 40 // a window with a 512-token prefill in it
		}
		tpots = append(tpots, tpot)
	}
	_, a, b, p, sigma := fitDecodeCurve(ks, tpots)
	f := Fit{StepA: a, StepB: b, StepP: p, StepSigma: sigma}
	if sigma > 1 || f.batchAtSLO(25, 0.95, 64) < 8 {
		t.Fatalf("fit %.2f + %.2f·k^%.2f σ %.2f: batch %.1f at 25 ms, want σ under 1 ms and a batch of 8 or more", a, b, p, sigma, f.batchAtSLO(25, 0.95, 64))
	}
}

// TestDecodeStepExponentNeedsAWideRange: points from batches 1–4 with a
// little noise. Their exponent is not known from them (fitted freely it
// swung between 0.25 and 1 from one window to the next); the prior's is
// kept and A and B fitted.
func TestDecodeStepExponentNeedsAWideRange(t *testing.T) {
	ks := []float64{1, 1.5, 2, 3, 4, 2.5, 1.2, 3.5}
	noise := []float64{0.3, -0.2, 0.4, -0.3, 0.1, -0.4, 0.2, 0}
	var tpots []float64
	for i, k := range ks {
		tpots = append(tpots, 2+0.6*k+noise[i])
	}
	kind, _, _, p, _ := fitDecodeCurve(ks, tpots)
	if kind != "fit" || p != priorStepExponent {
		t.Fatalf("%s fit at exponent %v, want A and B fitted at the prior's %v", kind, p, priorStepExponent)
	}
}
