package experiment

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
)

func TestScaleCheckScalesEveryRateOnce(t *testing.T) {
	m := &bench.PDModel{Workload: "chat", PrefillRate: 2, DecodeRate: 2}
	pts := []bench.RatioPoint{
		{P: 4, D: 4, Predicted: 8, Measured: 6, FirstMiss: 7, Bound: "search", Points: []bench.SearchPoint{{Rate: 6, Goodput: 5.5}}},
		{P: 5, D: 3, Predicted: 6, Measured: 4, FirstMiss: 5, Bound: "search"},
	}
	c := scaleCheck(bench.NewRatioCheck(m, 8, pts), 0.5)
	if c.Predicted.Goodput != 4 || c.Curve[3].Goodput != 4 || c.Splits[0].Measured != 3 || c.Splits[0].Predicted != 4 ||
		c.Splits[0].Points[0].Rate != 3 || c.Best.Measured != 3 || c.Best.Points[0].Rate != 3 || c.PredictedMeasured != 3 {
		t.Errorf("scaled check %+v", c)
	}
	if pts[0].Points[0].Rate != 6 {
		t.Error("scaling changed the caller's points")
	}
}

func TestRateTextSaysTheBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		pt   bench.RatioPoint
		want string
	}{
		{"a search bracket", bench.RatioPoint{Bound: "search", Measured: 1.25, FirstMiss: 2.5}, "1.25 (2.5 missed)"},
		{"even the lowest rate missed", bench.RatioPoint{Bound: "below", FirstMiss: 0.5}, "< 0.5 (the lowest rate tried missed)"},
		{"every rate met the goal, on a saturated host", bench.RatioPoint{Bound: "at least", Measured: 4, HostBound: true}, "≥ 4 (every rate tried met the goal) HOST-BOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := measuredText(tc.pt); got != tc.want {
				t.Errorf("measuredText = %q, want %q", got, tc.want)
			}
		})
	}
	if got := rateText("between", 0.4, 0.6, "0.44"); got != "0.4 (0.44)" {
		t.Errorf("a capacity between two rates: %q", got)
	}
	if got := rateText("none", 0, 0, ""); got != "-" {
		t.Errorf("no rate levels: %q", got)
	}
}
