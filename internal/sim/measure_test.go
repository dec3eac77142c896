package sim

import (
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// TestMeasureProfilesTheRealForwardPass profiles stories260K on a small
// grid and checks that the profile it writes reads back and replays its
// own points.
func TestMeasureProfilesTheRealForwardPass(t *testing.T) {
	m := loaded.Stories(t).Model
	var progress int
	p, err := Measure(m, MeasureConfig{
		Name: "stories260K", PrefillTokens: []int{8, 64, 100000}, Batches: []int{1, 4}, Contexts: []int{16, 200},
		Budget: 20 * time.Second, MinTime: time.Millisecond, MinReps: 2, MaxReps: 3,
		Progress: func(string, time.Duration) { progress++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Prefill) != 2 || len(p.Decode) != 4 || progress != 6 {
		t.Fatalf("measured %d prefill and %d decode points (%d reported), want 2 (100000 tokens exceed the model) and 4", len(p.Prefill), len(p.Decode), progress)
	}
	if p.Fingerprint != m.Fingerprint() || p.KVDType != "f32" || p.Version != ProfileVersion {
		t.Errorf("profile header %+v", p)
	}
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseProfile(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range q.Decode {
		if got := q.StepTime(Batch{Decodes: pt.Batch, DecodeContext: pt.Batch * pt.Context}); relErr(got, pt.Seconds) > gridTolerance {
			t.Errorf("decode %+v replayed as %v", pt, got)
		}
	}
}

func TestMonotoneLowersDisturbedPoints(t *testing.T) {
	p := &Profile{
		Prefill: []PrefillPoint{{64, 0.5}, {16, 0.1}, {128, 0.3}},
		Decode:  []DecodePoint{{1, 16, 0.05}, {1, 128, 0.02}, {4, 16, 0.04}, {4, 128, 0.06}},
	}
	monotone(p)
	if got := []float64{p.Prefill[0].Seconds, p.Prefill[1].Seconds, p.Prefill[2].Seconds}; got[0] != 0.1 || got[1] != 0.3 || got[2] != 0.3 {
		t.Errorf("prefill %v, want 0.1 0.3 0.3 (sorted by tokens)", got)
	}
	if got := p.Decode[0].Seconds; got != 0.02 {
		t.Errorf("decode batch 1 context 16: %v, want the 0.02 of batch 1 context 128", got)
	}
	if p.Decode[1].Seconds != 0.02 || p.Decode[2].Seconds != 0.04 || p.Decode[3].Seconds != 0.06 {
		t.Errorf("decode %+v: undisturbed points changed", p.Decode)
	}
}
