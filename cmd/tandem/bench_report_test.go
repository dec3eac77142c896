package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// gridParts are the saved runs of the P/D experiment's SLO grid made in
// two parts with the same seed (internal/bench/experiment/testdata/gridmerge,
// from scripts/gridmerge-fixtures.sh): the static configurations, then the
// adaptive one's cells.
func gridParts(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join("..", "..", "internal", "bench", "experiment", "testdata", "gridmerge")
	statics, err1 := filepath.Glob(filepath.Join(dir, "statics", "results-*.json"))
	adaptive, err2 := filepath.Glob(filepath.Join(dir, "adaptive", "results-*.json"))
	if err1 != nil || err2 != nil || len(statics) != 1 || len(adaptive) != 5 {
		t.Fatalf("saved runs in %s: %q, %q", dir, statics, adaptive)
	}
	return append(statics, adaptive...)
}

// TestBenchReportMerge: tandem bench report --merge prints the two parts
// as one run, with adaptive against the best static configuration in each
// of its cells, and writes that run as JSON that reads back as a run.
func TestBenchReportMerge(t *testing.T) {
	out := filepath.Join(t.TempDir(), "merged.json")
	var b bytes.Buffer
	if err := benchReport(&b, append([]string{"--merge", "--json", out}, gridParts(t)...)); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, want := range []string{"6 runs of workload chat reported as one:", "all with: model smollm2-135m-bf16, seed 7, 4 requests per rate and round",
		"goodput rates of pd-1p1d/conditional-1p1d/adaptive;", "adaptive-ttft0.5-tpot2 (TTFT ≤ 7.5ms, TPOT ≤ 4ms): goodput rate",
		"(each rate's attainment pools 8 requests per target (2 rounds of 4))", "adaptive is at least 0.9× the best static configuration in "} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	var m struct {
		Sources  []experiment.MergedSource `json:"merged_from"`
		Adaptive []experiment.AdaptiveCell `json:"adaptive_against_static"`
	}
	readJSON(t, out, &m)
	if len(m.Sources) != 6 || len(m.Adaptive) != 4 {
		t.Errorf("merged JSON: %d sources and %d adaptive cells, want 6 and 4", len(m.Sources), len(m.Adaptive))
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := bench.ReadSuite(f)
	if err != nil || len(s.Plan.Targets) != 3 || len(s.Grid) != 25 {
		t.Errorf("the merged JSON read as a run: %v", err)
	}
}

// TestBenchReportMergeRefusesAnotherSeed: a part run with another seed is
// refused, naming it; --pd-model and --merge do not go together.
func TestBenchReportMergeRefusesAnotherSeed(t *testing.T) {
	parts := gridParts(t)
	var raw map[string]any
	readJSON(t, parts[1], &raw)
	raw["plan"].(map[string]any)["seed"] = 8
	other := filepath.Join(t.TempDir(), "results-chat-adaptive-ttft0.5-tpot1.json")
	js, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, js, 0o644); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	err = benchReport(&b, []string{"--merge", parts[0], other})
	if err == nil || !strings.Contains(err.Error(), "seed: 7 against 8") || !strings.Contains(err.Error(), "--seed") {
		t.Errorf("err = %v, want the seeds named", err)
	}
	if err := benchReport(&b, append([]string{"--merge", "--pd-model", "pd-1p1d"}, parts...)); err == nil {
		t.Error("--merge --pd-model accepted")
	}
	if err := benchReport(&b, append([]string{"--json", filepath.Join(t.TempDir(), "x.json")}, parts...)); err == nil || !strings.Contains(err.Error(), "--merge") {
		t.Errorf("--json of several files without --merge: %v", err)
	}
}
