package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSplitsToMeasure(t *testing.T) {
	tests := []struct {
		name               string
		bestP, n, neighbor int
		far                bool
		want               []int
	}{
		{"a prefill-heavy prediction gets its neighbours, the half and a prefill-light quarter", 6, 8, 1, true, []int{2, 4, 5, 6, 7}},
		{"a decode-heavy prediction gets the other quarter", 3, 16, 1, true, []int{2, 3, 4, 8, 12}},
		{"a prediction of the half gets both quarters", 8, 16, 1, true, []int{4, 7, 8, 9, 12}},
		{"neighbours stop at one engine of each kind", 7, 8, 2, true, []int{2, 4, 5, 6, 7}},
		{"two neighbours a side", 10, 32, 2, true, []int{8, 9, 10, 11, 12, 16, 24}},
		{"four engines", 3, 4, 1, true, []int{1, 2, 3}},
		{"two engines have one split", 1, 2, 1, true, []int{1}},
		{"one engine has none", 1, 1, 1, true, nil},
		{"without the far ones only the neighbours", 6, 16, 2, false, []int{4, 5, 6, 7, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SplitsToMeasure(tc.bestP, tc.n, tc.neighbor, tc.far)); diff != "" {
				t.Errorf("SplitsToMeasure(%d, %d, %d, %v) (-want +got):\n%s", tc.bestP, tc.n, tc.neighbor, tc.far, diff)
			}
		})
	}
}

func TestSplitGoodputIsTheScarcerSide(t *testing.T) {
	m := PDModel{PrefillRate: 2, DecodeRate: 3}
	for _, tc := range []struct {
		p, d int
		want float64
	}{{1, 7, 2}, {3, 5, 6}, {4, 4, 8}, {5, 3, 9}, {7, 1, 3}} {
		if got := m.SplitGoodput(tc.p, tc.d); got != tc.want {
			t.Errorf("%dP:%dD: %v req/s, want %v", tc.p, tc.d, got, tc.want)
		}
	}
	for _, tc := range []struct {
		p, d int
		want string
	}{{3, 5, "prefill"}, {4, 4, "prefill"}, {5, 3, "decode"}} {
		if got := m.SplitLimit(tc.p, tc.d); got != tc.want {
			t.Errorf("%dP:%dD limited by %s, want %s", tc.p, tc.d, got, tc.want)
		}
	}
	// BestSplit agrees: at 8 engines 5P:3D gives min(10, 9) = 9.
	if b := m.BestSplit(8); b.P != 5 || b.Goodput != 9 {
		t.Errorf("BestSplit(8) = %+v, want 5P:3D at 9", b)
	}
}

func TestNewRatioCheck(t *testing.T) {
	// Prefill 1 req/s, decode 1 req/s per engine: 8 engines → 4P:4D at 4.
	m := &PDModel{Workload: "chat", PrefillRate: 1, DecodeRate: 1}
	pt := func(p int, measured, firstMiss float64) RatioPoint {
		return RatioPoint{P: p, D: 8 - p, Predicted: m.SplitGoodput(p, 8-p), Measured: measured, FirstMiss: firstMiss, Bound: "search"}
	}
	tests := []struct {
		name                  string
		splits                []RatioPoint
		verdict               string
		bestP                 int
		errPct, bestPct, regr float64
	}{
		{"the predicted split measures highest", []RatioPoint{pt(3, 2.5, 3), pt(4, 3, 3.5), pt(5, 2, 2.5)}, "right", 4, -25, -25, 0},
		{"a neighbour measures higher, its bracket above the predicted one's", []RatioPoint{pt(3, 2, 2.5), pt(4, 3, 3.4), pt(5, 4, 4.5)}, "wrong", 5, -25, 0, 0.25},
		{"a neighbour measures higher within the predicted split's bracket", []RatioPoint{pt(4, 3, 3.6), pt(5, 3.4, 4)}, "tie", 5, -25, -15, 1 - 3/3.4},
		{"an equal goodput counts for the prediction", []RatioPoint{pt(2, 3, 3.5), pt(4, 3, 3.5)}, "right", 2, -25, -25, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewRatioCheck(m, 8, tc.splits)
			if c.Predicted.P != 4 || c.Predicted.Goodput != 4 {
				t.Fatalf("predicted %+v, want 4P:4D at 4", c.Predicted)
			}
			if c.Verdict != tc.verdict || c.Best.P != tc.bestP {
				t.Errorf("verdict %q, best %dP; want %q, %dP", c.Verdict, c.Best.P, tc.verdict, tc.bestP)
			}
			for _, f := range []struct {
				name      string
				got, want float64
			}{{"error", 100 * c.GoodputError, tc.errPct}, {"best's error", 100 * c.BestError, tc.bestPct}, {"regret", c.Regret, tc.regr}} {
				if math.Abs(f.got-f.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
				}
			}
		})
	}
	t.Run("no split meeting the goal is no verdict", func(t *testing.T) {
		c := NewRatioCheck(m, 8, []RatioPoint{{P: 4, D: 4, FirstMiss: 1, Bound: "below"}, {P: 5, D: 3, FirstMiss: 1, Bound: "below"}})
		if c.Verdict != "none met" || !strings.Contains(c.VerdictText(), "NOTHING TO COMPARE") {
			t.Errorf("verdict %q: %s", c.Verdict, c.VerdictText())
		}
	})
	t.Run("a prediction not measured says so", func(t *testing.T) {
		if c := NewRatioCheck(m, 8, []RatioPoint{pt(2, 1, 2)}); c.Verdict != "not measured" || !strings.Contains(c.VerdictText(), "not measured") {
			t.Errorf("verdict %q", c.Verdict)
		}
	})
}

func TestCountMisses(t *testing.T) {
	ms := time.Millisecond
	slo := SLO{TTFT: 100 * ms, TPOT: 10 * ms}
	r := &Result{Records: []Record{
		{TTFT: 50 * ms, E2E: 50*ms + 10*5*ms, OutputTokens: 11},    // meets both
		{TTFT: 150 * ms, E2E: 150*ms + 10*5*ms, OutputTokens: 11},  // TTFT
		{TTFT: 50 * ms, E2E: 50*ms + 10*20*ms, OutputTokens: 11},   // TPOT
		{TTFT: 150 * ms, E2E: 150*ms + 10*20*ms, OutputTokens: 11}, // both
		{Err: "HTTP 500"},
	}}
	want := MissCauses{Requests: 5, TTFT: 2, TPOT: 2, Failed: 1}
	if got := CountMisses(r, slo); got != want {
		t.Errorf("CountMisses = %+v, want %+v", got, want)
	}
	if s := want.String(); s != "of 5: 2 TTFT, 2 TPOT, 1 failed" {
		t.Errorf("String = %q", s)
	}
}

func TestWriteRatioChecksMarksThePredictionAndScalesRates(t *testing.T) {
	m := &PDModel{Workload: "chat", PrefillRate: 1, DecodeRate: 1}
	c := NewRatioCheck(m, 8, []RatioPoint{
		{P: 4, D: 4, Predicted: 4, Measured: 3, FirstMiss: 3.5, Bound: "search", Misses: MissCauses{Requests: 40, TTFT: 6}},
		{P: 5, D: 3, Predicted: 3, Measured: 3.8, FirstMiss: 4, Bound: "search", HostBound: true, Host: "proxy 0.9 core"},
		{P: 6, D: 2, Predicted: 2, FirstMiss: 1, Bound: "below"},
	})
	var b strings.Builder
	WriteRatioChecks(&b, []RatioCheck{c}, 0.5)
	out := b.String()
	for _, want := range []string{"4P:4D ◀ predicted", "1.5 (decode)", "5P:3D ★ measured best", "1.5 (1.75 missed)", "1.9 (2 missed) HOST-BOUND", "< 0.5",
		"of 40: 6 TTFT, 0 TPOT, 0 failed", "proxy 0.9 core", "chat N=8: predicted 4P:4D at 2 req/s; measured best 5P:3D at 1.9 req/s",
		"error -25%", "the prediction is WRONG"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}
