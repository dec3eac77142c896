package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// gridSuite is two targets at two rates: "fast-start" answers quickly but
// streams at 80 ms per token; "smooth" takes 800 ms to the first token and
// then streams at 20 ms. At rate 2 each misses for a quarter of its
// requests (one in four is slow in the way the other is).
func gridSuite() *Suite {
	rec := func(ttft, tpot time.Duration) Record {
		const out = 11
		return Record{TTFT: ttft, E2E: ttft + (out-1)*tpot, OutputTokens: out}
	}
	level := func(target string, rate float64, ttft, tpot, badTTFT, badTPOT time.Duration) *Result {
		r := &Result{Target: target, Load: Load{Rate: rate}, Report: &Report{Duration: 4}}
		for i := range 4 {
			if rate == 2 && i == 3 {
				r.Records = append(r.Records, rec(badTTFT, badTPOT))
				continue
			}
			r.Records = append(r.Records, rec(ttft, tpot))
		}
		return r
	}
	ms := time.Millisecond
	return &Suite{
		Plan: &Plan{Targets: []Target{{Name: "fast-start"}, {Name: "smooth"}}, Goal: 0.75,
			SLO: SLO{TTFT: time.Second, TPOT: 100 * ms}},
		Results: []*Result{
			level("fast-start", 1, 200*ms, 80*ms, 0, 0),
			level("fast-start", 2, 200*ms, 80*ms, 200*ms, 150*ms),
			level("smooth", 1, 800*ms, 20*ms, 0, 0),
			level("smooth", 2, 800*ms, 20*ms, 1500*ms, 20*ms),
		},
	}
}

func TestSLOGridNamesTheWinnerOfEachPairOfObjectives(t *testing.T) {
	cells := SLOGrid(gridSuite(), []float64{0.5, 1}, []float64{0.5, 1})
	if len(cells) != 4 {
		t.Fatalf("%d cells, want 4", len(cells))
	}
	type want struct {
		best  []string
		rates map[string]float64 // interpolated goodput rate estimate per target (0: below the lowest rate)
	}
	wants := map[[2]float64]want{
		// TTFT 0.5 s, TPOT 50 ms: fast-start streams too slowly, smooth starts too late.
		{0.5, 0.5}: {nil, map[string]float64{"fast-start": 0, "smooth": 0}},
		// TTFT 0.5 s, TPOT 100 ms: only fast-start; it meets 100% at 1 and 75% (= the goal) at 2.
		{0.5, 1}: {[]string{"fast-start"}, map[string]float64{"fast-start": 2, "smooth": 0}},
		// TTFT 1 s, TPOT 50 ms: only smooth; 75% at 2 again.
		{1, 0.5}: {[]string{"smooth"}, map[string]float64{"fast-start": 0, "smooth": 2}},
		// Both loose: both meet the goal at every rate, a tie.
		{1, 1}: {[]string{"fast-start", "smooth"}, map[string]float64{"fast-start": 2, "smooth": 2}},
	}
	for _, c := range cells {
		w, ok := wants[[2]float64{c.TTFTScale, c.TPOTScale}]
		if !ok {
			t.Fatalf("unexpected cell %v×%v", c.TTFTScale, c.TPOTScale)
		}
		if !slices.Equal(c.Best, w.best) {
			t.Errorf("TTFT ×%v, TPOT ×%v: best %v, want %v", c.TTFTScale, c.TPOTScale, c.Best, w.best)
		}
		for _, cp := range c.Capacities {
			if got := goodputEstimate(cp); math.Abs(got-w.rates[cp.Target]) > 1e-12 {
				t.Errorf("TTFT ×%v, TPOT ×%v: %s goodput %v (%s), want %v", c.TTFTScale, c.TPOTScale, cp.Target, got, cp.Bound, w.rates[cp.Target])
			}
		}
		if c.SLO.TTFT != time.Duration(float64(time.Second)*c.TTFTScale) || c.SLO.TPOT != time.Duration(float64(100*time.Millisecond)*c.TPOTScale) {
			t.Errorf("cell %v×%v has SLO %+v", c.TTFTScale, c.TPOTScale, c.SLO)
		}
	}
}

func TestSLOGridRecomputesGoodputFromTheRecords(t *testing.T) {
	// TTFT 1 s, TPOT 100 ms: fast-start's rate-2 level has 3 of 4 met over 4 s.
	cells := SLOGrid(gridSuite(), []float64{1}, []float64{1})
	fs := cells[0].Capacities[0]
	if fs.Target != "fast-start" || len(fs.Points) != 2 || fs.Points[1].Attainment != 0.75 || fs.Points[1].Goodput != 0.75 {
		t.Errorf("fast-start under the plan's SLO: %+v", fs)
	}
}

func TestSLOGridNeedsBothObjectivesAndRates(t *testing.T) {
	s := gridSuite()
	s.Plan.SLO.TPOT = 0
	if cells := SLOGrid(s, GridScales, GridScales); cells != nil {
		t.Errorf("a TTFT-only SLO gave %d cells", len(cells))
	}
	s = gridSuite()
	for _, r := range s.Results {
		r.Load = Load{Concurrency: 4}
	}
	if cells := SLOGrid(s, GridScales, GridScales); cells != nil {
		t.Errorf("closed-loop levels gave %d cells", len(cells))
	}
}

func TestWriteSLOGrid(t *testing.T) {
	var b bytes.Buffer
	WriteSLOGrid(&b, SLOGrid(gridSuite(), []float64{0.5, 1}, []float64{0.5, 1}))
	got := b.String()
	for _, want := range []string{
		"×0.5 (50ms)", "×1 (100ms)", // TPOT columns
		"×0.5 (500ms)", "×1 (1s)", // TTFT rows
		"none <1",                 // neither meets TTFT 0.5 s and TPOT 50 ms even at rate 1
		"fast-start ≥2/<1",        // TTFT 0.5 s, TPOT 100 ms
		"smooth <1/≥2",            // TTFT 1 s, TPOT 50 ms
		"fast-start=smooth ≥2/≥2", // both loose
	} {
		if !strings.Contains(got, want) {
			t.Errorf("grid lacks %q:\n%s", want, got)
		}
	}
}

func TestRescoreRecomputesFromTheRecords(t *testing.T) {
	s := gridSuite()
	s.Rescore(SLO{TTFT: 500 * time.Millisecond}, 0)
	// Under TTFT ≤ 500 ms alone fast-start meets every request and smooth
	// none; the grid needs a TPOT objective too, so there is none.
	for _, r := range s.Results {
		want := 1.0
		if r.Target == "smooth" {
			want = 0
		}
		if r.Attained != want || len(r.Curve) != len(SLOScales) {
			t.Errorf("%s at %v: attained %v, curve %v; want %v", r.Target, r.Load.Rate, r.Attained, r.Curve, want)
		}
	}
	if len(s.Capacity) != 2 || s.Capacity[0].Bound != "at least" || s.Capacity[1].Bound != "below" || s.Grid != nil {
		t.Errorf("capacities %+v, grid %d cells", s.Capacity, len(s.Grid))
	}
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(s); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSuite(&b); err == nil || !strings.Contains(err.Error(), "no plan or workload") {
		t.Errorf("a run without a workload read as %v", err)
	}
}
