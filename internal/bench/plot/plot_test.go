package plot

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/workload"
)

func TestSuiteWritesEveryFigureAsPNGAndSVG(t *testing.T) {
	w := workload.Lengths("fixed", 0, 3, workload.Fixed(4), workload.Fixed(3), []int32{10})
	s := &bench.Suite{Plan: &bench.Plan{
		Targets: []bench.Target{{Name: "pd"}, {Name: "colocated"}}, Workload: w,
		Loads: []bench.Load{{Rate: 1}, {Rate: 2}}, SLO: bench.SLO{TTFT: time.Second},
	}}
	for _, l := range s.Plan.Loads {
		for k, tg := range s.Plan.Targets {
			r := &bench.Result{Target: tg.Name, Load: l, Report: &bench.Report{}, Goodput: l.Rate / float64(k+1)}
			for i := range 20 {
				d := time.Duration(i+1+k*5) * time.Millisecond
				r.Records = append(r.Records, bench.Record{Start: time.Duration(i) * 100 * time.Millisecond, TTFT: 10 * d, E2E: 40 * d,
					OutputTokens: 4, ITL: []time.Duration{d, 2 * d, 3 * d}})
			}
			r.Records = append(r.Records, bench.Record{Err: "failed"})
			s.Results = append(s.Results, r)
		}
	}
	dir := t.TempDir()
	files, err := Suite(dir, "x-", s)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 6 {
		t.Fatalf("wrote %v, want 3 figures × PNG and SVG", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasSuffix(f, ".png") && !bytes.HasPrefix(b, []byte("\x89PNG")):
			t.Errorf("%s is not a PNG", f)
		case strings.HasSuffix(f, ".svg") && !bytes.Contains(b, []byte("<svg")):
			t.Errorf("%s is not an SVG", f)
		case len(b) < 1000:
			t.Errorf("%s has only %d bytes", f, len(b))
		}
	}
}

// A phased experiment run with only adaptive's cells of other objectives
// leaves the workload's suite without targets or results: nothing to draw,
// and no panic (save tiled rows[0] of an empty figure).
func TestSuiteWithoutTargetsWritesNothing(t *testing.T) {
	w := workload.Lengths("fixed", 0, 3, workload.Fixed(4), workload.Fixed(3), []int32{10})
	for _, s := range []*bench.Suite{
		{Plan: &bench.Plan{Workload: w, Loads: []bench.Load{{Rate: 1}}}},
		{Plan: &bench.Plan{Workload: w, Targets: []bench.Target{{Name: "pd"}}, Loads: []bench.Load{{Rate: 1}}}},
	} {
		files, err := Suite(t.TempDir(), "x-", s)
		if err != nil || len(files) != 0 {
			t.Errorf("targets %v: wrote %v (%v), want nothing", s.Plan.Targets, files, err)
		}
	}
}

func TestRatioDrawsAPanelPerCheck(t *testing.T) {
	m := &bench.PDModel{Workload: "chat", PrefillRate: 1, DecodeRate: 2}
	var checks []bench.RatioCheck
	for _, n := range []int{8, 16, 32} {
		var pts []bench.RatioPoint
		for _, p := range bench.SplitsToMeasure(m.BestSplit(n).P, n, 1, true) {
			g := m.SplitGoodput(p, n-p)
			pts = append(pts, bench.RatioPoint{P: p, D: n - p, Predicted: g, Measured: 0.8 * g, FirstMiss: g, Bound: "search"})
		}
		checks = append(checks, bench.NewRatioCheck(m, n, pts))
	}
	files, err := Ratio(t.TempDir(), "ratio", checks, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("wrote %v, want a PNG and an SVG", files)
	}
	b, err := os.ReadFile(files[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"chat, N = 8 engines", "chat, N = 32 engines", "predicted best 5P:3D", "measured best"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
}
