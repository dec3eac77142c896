package experiment

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
)

// The saved runs in testdata/gridmerge come from three tiny phased
// experiments on simulated engines with the same seed and workload flags
// (scripts/gridmerge-fixtures.sh): combined (static and adaptive
// configurations in one run, with its report.txt), statics, and adaptive.

// readRuns reads the results-*.json files of testdata/gridmerge/part, in
// the order a shell glob lists them.
func readRuns(t *testing.T, part string) []RunFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "gridmerge", part, "results-*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no saved runs in testdata/gridmerge/%s (%v): run scripts/gridmerge-fixtures.sh", part, err)
	}
	var out []RunFile
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		s, err := bench.ReadSuite(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, RunFile{Path: p, Suite: s})
	}
	return out
}

// section is the lines of text from the first starting with from to the
// first after it starting with to, both included.
func section(t *testing.T, text, from, to string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, from) })
	if i < 0 {
		t.Fatalf("no line starting %q in:\n%s", from, text)
	}
	j := slices.IndexFunc(lines[i:], func(l string) bool { return strings.HasPrefix(l, to) })
	if j < 0 {
		t.Fatalf("no line starting %q after %q in:\n%s", to, from, text)
	}
	return strings.Join(lines[i:i+j+1], "\n")
}

// runLines are the lines giving each adaptive run's goodput rate in its
// cell.
func runLines(text string) []string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(l, "  "+Adaptive) && strings.Contains(l, "(TTFT ≤ ") {
			out = append(out, l)
		}
	}
	return out
}

func writeMerged(t *testing.T, files []RunFile) (*MergedRun, string) {
	t.Helper()
	m, err := MergeRuns(files, bench.SLO{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := m.Write(&b); err != nil {
		t.Fatal(err)
	}
	return m, b.String()
}

// gridEnd is the start of the SLO grid's last row in the saved runs (TTFT
// scale 4 of 15ms).
const gridEnd = "  ×4 (60ms)"

// TestMergeRunsReproducesCombinedRun: the files of one combined run,
// merged, print the run's own table, SLO grid, adaptive runs and
// adaptive-against-static table; and so do the same files split into a
// statics part and an adaptive part, given in either order.
func TestMergeRunsReproducesCombinedRun(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "gridmerge", "combined", "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	check := func(name string, files []RunFile) {
		t.Helper()
		_, got := writeMerged(t, files)
		if g, w := section(t, got, "workload chat", gridEnd), section(t, report, "workload chat", gridEnd); g != w {
			t.Errorf("%s: table and grid:\n%s\nwant the combined run's:\n%s", name, g, w)
		}
		if g, w := runLines(got), runLines(report); !slices.Equal(g, w) || len(w) != 4 {
			t.Errorf("%s: adaptive runs:\n%s\nwant the combined run's four:\n%s", name, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
		if g, w := section(t, got, "(in the grid above", "adaptive is at least"), section(t, report, "(in the grid above", "adaptive is at least"); g != w {
			t.Errorf("%s: adaptive against static:\n%s\nwant the combined run's:\n%s", name, g, w)
		}
	}
	combined := readRuns(t, "combined")
	check("combined", combined)

	// The combined results-chat.json split in two files, as if the static
	// configurations and the adaptive one had been run apart.
	var statics, adaptive []RunFile
	for _, f := range combined {
		if s := only(f.Suite, func(n string) bool { return n != Adaptive }); s != nil && filepath.Base(f.Path) == "results-chat.json" {
			statics = append(statics, RunFile{Path: "statics/results-chat.json", Suite: s})
			adaptive = append(adaptive, RunFile{Path: "adaptive/results-chat.json", Suite: only(f.Suite, func(n string) bool { return n == Adaptive })})
			continue
		}
		adaptive = append(adaptive, f)
	}
	check("split, statics first", append(slices.Clone(statics), adaptive...))
	check("split, adaptive first", append(slices.Clone(adaptive), statics...))
}

// TestMergeRunsSeparateParts merges two real runs made apart with the same
// flags, the static configurations and then the adaptive one's cells: one
// run of both, each adaptive cell compared with the statics.
func TestMergeRunsSeparateParts(t *testing.T) {
	files := append(readRuns(t, "statics"), readRuns(t, "adaptive")...)
	m, out := writeMerged(t, files)
	want := []string{"pd-1p1d", "conditional-1p1d", Adaptive}
	if got := targetsOf(m.Suite); !slices.Equal(got, want) {
		t.Errorf("merged targets %q, want %q", got, want)
	}
	if len(m.AdaptiveRuns) != 4 || len(m.Adaptive) != 4 {
		t.Fatalf("%d adaptive runs and %d compared cells, want 4 and 4:\n%s", len(m.AdaptiveRuns), len(m.Adaptive), out)
	}
	for i, c := range [][2]float64{{0.5, 1}, {0.5, 2}, {1, 1}, {1, 2}} {
		r, a := m.AdaptiveRuns[i], m.Adaptive[i]
		if r.TTFTScale != c[0] || r.TPOTScale != c[1] || a.TTFTScale != c[0] || a.TPOTScale != c[1] || r.Name != AdaptiveCellName(c[0], c[1]) {
			t.Errorf("cell %d: run %s at %g×%g, compared at %g×%g; want %g×%g", i, r.Name, r.TTFTScale, r.TPOTScale, a.TTFTScale, a.TPOTScale, c[0], c[1])
		}
		if r.SLO != scaleSLO(m.Suite.Plan.SLO, c[0], c[1]) {
			t.Errorf("cell %d scored under %+v, want the workload's SLO scaled", i, r.SLO)
		}
	}
	// Each rate pools both rounds' requests.
	if m.Pooled != "8 requests per target (2 rounds of 4)" || !strings.Contains(out, "(each rate's attainment pools 8 requests per target (2 rounds of 4))") {
		t.Errorf("pooled %q; report:\n%s", m.Pooled, out)
	}
	for _, r := range m.Suite.Results {
		if len(r.Records) != 8 || r.Requests != 8 {
			t.Errorf("%s at %s: %d records, want 2 rounds of 4", r.Target, r.Load, len(r.Records))
		}
	}
	if len(m.Notes) != 0 || !strings.Contains(out, "warm-up 2 requests at 10 req/s") {
		t.Errorf("notes %q; report:\n%s", m.Notes, out)
	}
}

// TestMergeRunsRefusesMismatchedRuns: runs that differ in what makes them
// one workload are refused with an error naming what differs; a target
// twice with different requests, and adaptive cells alone, too.
func TestMergeRunsRefusesMismatchedRuns(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		change     func(s *bench.Suite)
	}{
		{"seed", "seed: 7 against 8", func(s *bench.Suite) { s.Plan.Seed = 8 }},
		{"rates", "loads: [rate 10 rate 40 rate 80] against [rate 10 rate 40]", func(s *bench.Suite) { s.Plan.Loads = s.Plan.Loads[:2] }},
		{"rounds", "rounds: 2 against 3", func(s *bench.Suite) { s.Plan.Rounds = 3 }},
		{"requests", "requests per rate and round: 4 against 5", func(s *bench.Suite) { s.Prompts.Requests = 5 }},
		{"prompts", "prompts: digest", func(s *bench.Suite) { s.Prompts.Digest = strings.Repeat("0", 64) }},
		{"warm-up", "warm-up: 2 requests at 10 req/s against none", func(s *bench.Suite) { s.Plan.Warmup = &bench.Warmup{} }},
		{"workload", "workload: chat against long", func(s *bench.Suite) { s.Plan.Workload.Name = "long" }},
		{"goal", "goal: 0.9 against 0.8", func(s *bench.Suite) { s.Plan.Goal = 0.8 }},
		{"slo", "SLO: TTFT ≤ 30ms", func(s *bench.Suite) { s.Plan.SLO.TTFT *= 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			statics, adaptive := readRuns(t, "statics"), readRuns(t, "adaptive")
			// The adaptive part's results-chat.json (its last file).
			tc.change(adaptive[len(adaptive)-1].Suite)
			_, err := MergeRuns(append(statics, adaptive...), bench.SLO{}, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not runs of the same workload") {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	t.Run("cell SLO", func(t *testing.T) {
		statics, adaptive := readRuns(t, "statics"), readRuns(t, "adaptive")
		adaptive[0].Suite.Plan.SLO = statics[0].Suite.Plan.SLO // the 0.5× TTFT cell's run, scored at ×1
		_, err := MergeRuns(append(statics, adaptive[0]), bench.SLO{}, 0)
		if err == nil || !strings.Contains(err.Error(), "want the cell's (TTFT ×0.5, TPOT ×1") {
			t.Errorf("err = %v, want the cell's SLO named", err)
		}
	})
	t.Run("engines", func(t *testing.T) {
		statics, adaptive := readRuns(t, "statics"), readRuns(t, "adaptive")
		statics[0].Summary = &PDSummary{Engines: 2, MNBT: 256}
		for i := range adaptive {
			adaptive[i].Summary = &PDSummary{Engines: 4, MNBT: 512}
		}
		_, err := MergeRuns(append(statics, adaptive...), bench.SLO{}, 0)
		if err == nil || !strings.Contains(err.Error(), "engines per configuration (summary.json): 2 against 4") ||
			!strings.Contains(err.Error(), "--max-num-batched-tokens (summary.json): 256 against 512") {
			t.Errorf("err = %v, want the engines and chunk budgets named", err)
		}
		adaptive = readRuns(t, "adaptive")
		if _, err := MergeRuns(append(statics, adaptive...), bench.SLO{}, 0); err != nil {
			t.Errorf("a part without summary.json refused: %v", err)
		}
	})
	t.Run("same target twice", func(t *testing.T) {
		// The combined run's adaptive beside the adaptive part's: the same
		// name, other requests.
		files := append(readRuns(t, "statics"), readRuns(t, "adaptive")...)
		files = append(files, readRuns(t, "combined")[0])
		_, err := MergeRuns(files, bench.SLO{}, 0)
		if err == nil || !strings.Contains(err.Error(), "different requests") {
			t.Errorf("err = %v, want the duplicate target refused", err)
		}
	})
	t.Run("cells only", func(t *testing.T) {
		_, err := MergeRuns(readRuns(t, "adaptive")[:3], bench.SLO{}, 0)
		if err == nil || !strings.Contains(err.Error(), "give the run at the workload's own objectives too") {
			t.Errorf("err = %v, want the static configurations asked for", err)
		}
	})
}

// TestMergeRunsUnderOtherObjectives: objectives given in place of the
// runs' rescore every target, and each adaptive run under its cell's
// scaling of them.
func TestMergeRunsUnderOtherObjectives(t *testing.T) {
	files := append(readRuns(t, "statics"), readRuns(t, "adaptive")...)
	own := files[0].Suite.Plan.SLO
	slo := bench.SLO{TTFT: 4 * own.TTFT}
	m, err := MergeRuns(files, slo, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if m.Suite.Plan.SLO.TTFT != 4*own.TTFT || m.Suite.Plan.SLO.TPOT != own.TPOT || m.Suite.Plan.Goal != 0.5 {
		t.Errorf("merged SLO %+v goal %g, want TTFT ×4 and goal 0.5", m.Suite.Plan.SLO, m.Suite.Plan.Goal)
	}
	for _, r := range m.AdaptiveRuns {
		if want := scaleSLO(m.Suite.Plan.SLO, r.TTFTScale, r.TPOTScale); r.SLO != want || r.Capacity.Goal != 0.5 {
			t.Errorf("%s under %+v goal %g, want %+v and 0.5", r.Name, r.SLO, r.Capacity.Goal, want)
		}
	}
}

// TestAdaptiveCellName: the names of the adaptive runs parse back to
// their cells; other names do not.
func TestAdaptiveCellName(t *testing.T) {
	for _, c := range [][2]float64{{1, 1}, {0.5, 2}, {0.25, 1}, {4, 0.5}} {
		ft, fp, ok := ParseAdaptiveCell(AdaptiveCellName(c[0], c[1]))
		if !ok || ft != c[0] || fp != c[1] {
			t.Errorf("%q parses as %g, %g, %v", AdaptiveCellName(c[0], c[1]), ft, fp, ok)
		}
	}
	if AdaptiveCellName(0.5, 2) != "adaptive-ttft0.5-tpot2" || AdaptiveCellName(1, 1) != Adaptive {
		t.Errorf("names %q and %q", AdaptiveCellName(0.5, 2), AdaptiveCellName(1, 1))
	}
	for _, n := range []string{"pd-1p3d", "adaptive-warmup", "adaptive-ttft1-tpot1", "adaptive-ttft0-tpot1", "adaptive-ttftx-tpot2", "adaptive-ttft0.50-tpot2"} {
		if _, _, ok := ParseAdaptiveCell(n); ok {
			t.Errorf("%q parsed as an adaptive cell", n)
		}
	}
}

// TestWriteAdaptiveCellsLaysOutByScale: cells that do not fill a
// rectangle (two adaptive runs of different grids merged) are placed by
// their scales, a missing pair left blank.
func TestWriteAdaptiveCellsLaysOutByScale(t *testing.T) {
	cells := []AdaptiveCell{
		{TTFTScale: 0.5, TPOTScale: 1, Adaptive: 1, BestStatic: 2, Ratio: 0.5},
		{TTFTScale: 1, TPOTScale: 1, Adaptive: 2, BestStatic: 2, Ratio: 1},
		{TTFTScale: 1, TPOTScale: 2, Adaptive: 3, BestStatic: 2, Ratio: 1.5},
	}
	var b strings.Builder
	writeAdaptiveCells(&b, cells, "8 requests per target (2 rounds of 4)")
	want := "(each rate's attainment pools 8 requests per target (2 rounds of 4))\n" +
		"  TTFT ×  \\  TPOT ×     1      2\n" +
		"                0.5  0.50       \n" +
		"                  1  1.00  1.50*\n" +
		"adaptive is at least 0.9× the best static configuration in 2 of the 3 cells some static configuration met, and above every static one in 1\n"
	if got := b.String(); !strings.HasSuffix(got, want) {
		t.Errorf("got:\n%s\nwant it to end:\n%s", got, want)
	}
}
