package planner

import (
	"math"
	"testing"
)

// TestLifeSpread: streams all as long as each other see a mean batch over
// their lives with variance 2/3 of the mean batch (M/D/∞); a stream far
// shorter than the most of the load sees nearly one Poisson draw (variance
// the mean: 0.83 here), a far longer one averages more of the others'
// comings and goings (0.41).
func TestLifeSpread(t *testing.T) {
	for _, h := range lifeSpread([]float64{101, 101, 101, 101}) {
		if math.Abs(h-2.0/3) > 1e-3 {
			t.Fatalf("equal lives: h %v, want 2/3", h)
		}
	}
	var outputs []float64 // 64 streams of 10 steps, 8 of 100
	for i := range 64 {
		outputs = append(outputs, 11)
		if i%8 == 0 {
			outputs = append(outputs, 101)
		}
	}
	hs := lifeSpread(outputs)
	if short, long := hs[0], hs[len(hs)-1]; short < 0.8 || long > 0.5 {
		t.Fatalf("short streams' h %v, long streams' %v: want 0.8 or more and 1/2 or less", short, long)
	}
}

// TestStepPastTheBatchesSeen: a flat concave fit over batches 1–16 is
// grown past 16 as the prior's shape (×1.46 from 16 to 32), where the
// curve itself gives ×1.23; a line over batches 4–16 keeps its slope;
// batches up to 3 keep the prior's shape however steep their line.
func TestStepPastTheBatchesSeen(t *testing.T) {
	flat := Fit{StepA: 0.19, StepB: 8.13, StepP: 0.3, StepBatchMax: 16}
	want := flat.curveMs(16) * priorShape(32) / priorShape(16)
	if got := flat.stepMs(32); math.Abs(got-want) > 1e-9 || got < 1.4*flat.stepMs(16) {
		t.Fatalf("flat fit at 32: %.2f ms, want %.2f (the prior's ×%.2f from 16)", got, want, priorShape(32)/priorShape(16))
	}
	if flat.stepMs(8) != flat.curveMs(8) {
		t.Fatalf("within the batches seen the step is the curve's")
	}
	line := Fit{StepA: 10, StepB: 2, StepP: 1, StepBatchMax: 16}
	if got := line.stepMs(45); math.Abs(got-100) > 1e-9 {
		t.Fatalf("line over 4–16 at 45: %.2f ms, want its own 100", got)
	}
	steep := Fit{StepA: 0.67, StepB: 4.76, StepP: 1, StepBatchMax: 3}
	if got, want := steep.stepMs(16), steep.curveMs(3)*priorShape(16)/priorShape(3); math.Abs(got-want) > 1e-9 {
		t.Fatalf("steep line over 1–3 at 16: %.2f ms, want the prior's growth from 3, %.2f (the line: %.2f)", got, want, steep.curveMs(16))
	}
	if k := line.batchAtSLO(100, 0.5, 64); math.Abs(k-45) > 1e-6 {
		t.Fatalf("batch at 100 ms: %v, want 45 (stepMs solved for k)", k)
	}
}
