package experiment

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tandem-serve/tandem/internal/bench"
)

// RunFile is a saved run of one workload (tandem bench --json, or an
// experiment's results-*.json) and where it was read from.
type RunFile struct {
	Path  string
	Suite *bench.Suite
	// Summary, when not nil, is the summary.json of the experiment that
	// saved it: its engines and chunk budget are compared too.
	Summary *PDSummary
}

// MergedRun is several saved runs of one workload reported as one (tandem
// bench report --merge): the P/D experiment's SLO grid run in parts with
// the same seed — the static configurations, then the adaptive one's
// cells, say — scored and compared as a single run would have been.
type MergedRun struct {
	// Sources are the files merged and the targets each gave.
	Sources []MergedSource `json:"merged_from"`
	// Notes are what the runs differ in that does not keep them apart.
	Notes []string `json:"notes,omitempty"`
	// Suite is every static configuration and the adaptive run planning
	// for the workload's own objectives (if any), scored under the SLO.
	*bench.Suite
	// AdaptiveRuns are the adaptive configuration's runs, one per cell it
	// planned for, each scored under its cell's objectives.
	AdaptiveRuns []AdaptiveRun `json:"adaptive_runs,omitempty"`
	// Adaptive compares each adaptive run with the best static
	// configuration in its cell (nil without both).
	Adaptive []AdaptiveCell `json:"adaptive_against_static,omitempty"`
	// Pooled says how many requests each rate's attainment pools.
	Pooled string `json:"pooled,omitempty"`

	// cellRuns are AdaptiveRuns' suites.
	cellRuns []*bench.Suite
}

// MergedSource is one file of a MergedRun.
type MergedSource struct {
	Path    string   `json:"path"`
	Targets []string `json:"targets"`
}

// MergeRuns reports files, runs of the same workload saved apart, as one
// run under slo and goal (zero fields, 0: the runs' own): it checks that
// they are comparable (the same workload and prompts, model, seed,
// requests per rate and round, rates, rounds, warm-up, goal and SLO; an
// adaptive cell's run, named by AdaptiveCellName, under the SLO scaled by
// its cell), merges their targets and compares every adaptive run with the
// best static configuration in its cell, as the phased comparison does
// (runPhasedWorkload). A target found in two files is kept once when the
// two hold the same requests.
func MergeRuns(files []RunFile, slo bench.SLO, goal float64) (*MergedRun, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("no run to merge")
	}
	m := &MergedRun{}
	var base *RunFile
	for i := range files {
		f := &files[i]
		names := targetsOf(f.Suite)
		m.Sources = append(m.Sources, MergedSource{Path: f.Path, Targets: names})
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: no results in it", f.Path)
		}
		if base == nil && slices.ContainsFunc(names, func(n string) bool { return !isCellRun(n) }) {
			base = f
		}
	}
	if base == nil {
		return nil, fmt.Errorf("only adaptive cell runs given (%s): give the run at the workload's own objectives too, e.g. the static configurations' results-%s.json",
			files[0].Path, files[0].Suite.Plan.Workload.Name)
	}
	own := base.Suite.Plan.SLO
	for i := range files {
		f := &files[i]
		if f == base {
			continue
		}
		diffs := bench.Differences(base.Suite, f.Suite)
		want, what := own, "the workload's own"
		if names := targetsOf(f.Suite); slices.ContainsFunc(names, isCellRun) {
			if len(names) != 1 {
				return nil, fmt.Errorf("%s: adaptive cell runs (%s) beside other targets: want one cell run a file, as the experiment saves them", f.Path, strings.Join(names, ", "))
			}
			ft, fp, _ := ParseAdaptiveCell(names[0])
			want, what = scaleSLO(own, ft, fp), fmt.Sprintf("the cell's (TTFT ×%g, TPOT ×%g of %s's)", ft, fp, base.Path)
		}
		if a, b := base.Summary, f.Summary; a != nil && b != nil {
			if a.Engines != b.Engines {
				diffs = append(diffs, fmt.Sprintf("engines per configuration (summary.json): %d against %d", a.Engines, b.Engines))
			}
			if a.MNBT != b.MNBT {
				diffs = append(diffs, fmt.Sprintf("--max-num-batched-tokens (summary.json): %d against %d", a.MNBT, b.MNBT))
			}
		}
		if f.Suite.Plan.SLO != want {
			diffs = append(diffs, fmt.Sprintf("SLO: %s, want %s: %s", describe(f.Suite.Plan.SLO), what, describe(want)))
		}
		if len(diffs) > 0 {
			return nil, fmt.Errorf("%s and %s are not runs of the same workload: %s (run both parts with the same --seed, --requests, --rounds, rates, --warmup, --goal and SLO flags)",
				base.Path, f.Path, strings.Join(diffs, "; "))
		}
		if n := bench.LevelNote(base.Suite, f.Suite); n != "" {
			m.Notes = append(m.Notes, fmt.Sprintf("%s and %s: %s", base.Path, f.Path, n))
		}
		if base.Suite.Plan.Warmup == nil || f.Suite.Plan.Warmup == nil {
			m.Notes = appendOnce(m.Notes, "warm-up not compared: a file saved before runs recorded it")
		}
		if base.Suite.Prompts == nil || f.Suite.Prompts == nil {
			m.Notes = appendOnce(m.Notes, "prompts compared by workload, seed and requests only: a file saved before runs recorded their digest")
		}
	}
	slo = bench.SLO{TTFT: cmp.Or(slo.TTFT, own.TTFT), TPOT: cmp.Or(slo.TPOT, own.TPOT), ITL: cmp.Or(slo.ITL, own.ITL)}

	// The main suite as the phased comparison builds it: the static
	// configurations in the order given, then the adaptive run at the
	// workload's own objectives.
	var statics, main []*bench.Suite
	for _, f := range files {
		if p := only(f.Suite, func(n string) bool { _, _, adaptive := ParseAdaptiveCell(n); return !adaptive }); p != nil {
			statics = append(statics, p)
		}
	}
	main = slices.Clone(statics)
	for _, f := range files {
		if p := only(f.Suite, func(n string) bool { return n == Adaptive }); p != nil {
			main = append(main, p)
		}
	}
	var err error
	if m.Suite, err = bench.MergeSuites(main); err != nil {
		return nil, err
	}
	m.Suite.Rescore(slo, goal)
	m.Pooled = bench.PooledNote(m.Suite)
	var staticOnly *bench.Suite
	if len(statics) > 0 {
		if staticOnly, err = bench.MergeSuites(statics); err != nil {
			return nil, err
		}
		staticOnly.Rescore(slo, goal)
	}

	// Every adaptive run, once per cell, in the order of the cells.
	type cellRun struct {
		name     string
		ft, fp   float64
		suite    *bench.Suite
		fromPath string
	}
	var runs []cellRun
	for _, f := range files {
		for _, n := range targetsOf(f.Suite) {
			ft, fp, ok := ParseAdaptiveCell(n)
			if !ok {
				continue
			}
			one, err := bench.MergeSuites([]*bench.Suite{only(f.Suite, func(t string) bool { return t == n })})
			if err != nil {
				return nil, err
			}
			if i := slices.IndexFunc(runs, func(r cellRun) bool { return r.name == n }); i >= 0 {
				if _, err := bench.MergeSuites([]*bench.Suite{runs[i].suite, one}); err != nil {
					return nil, fmt.Errorf("%s and %s: %w", runs[i].fromPath, f.Path, err)
				}
				continue
			}
			runs = append(runs, cellRun{name: n, ft: ft, fp: fp, suite: one, fromPath: f.Path})
		}
	}
	slices.SortStableFunc(runs, func(a, b cellRun) int { return cmp.Or(cmp.Compare(a.ft, b.ft), cmp.Compare(a.fp, b.fp)) })
	var cells []bench.GridCell
	for _, r := range runs {
		r.suite.Rescore(scaleSLO(slo, r.ft, r.fp), goal)
		var c bench.Capacity
		if staticOnly != nil {
			var cell bench.GridCell
			var ok bool
			if c, cell, ok = adaptiveCell(staticOnly, r.suite, r.ft, r.fp); ok {
				cells = append(cells, cell)
			}
		} else if len(r.suite.Capacity) > 0 {
			c = r.suite.Capacity[0]
			c.Target = Adaptive
		}
		m.AdaptiveRuns = append(m.AdaptiveRuns, AdaptiveRun{Name: r.name, TTFTScale: r.ft, TPOTScale: r.fp, SLO: r.suite.Plan.SLO, Capacity: c})
		m.cellRuns = append(m.cellRuns, r.suite)
	}
	m.Adaptive = adaptiveCells(cells)
	return m, nil
}

// Write prints m as the phased comparison prints a workload: where each
// target came from, the table and SLO grid of the static configurations
// and the adaptive run at the workload's own objectives, each adaptive
// run's goodput rate in its cell, and the adaptive-against-static table.
func (m *MergedRun) Write(w io.Writer) error {
	fmt.Fprintf(w, "%d runs of workload %s reported as one:\n", len(m.Sources), m.Suite.Plan.Workload.Name)
	for _, s := range m.Sources {
		fmt.Fprintf(w, "  %s: %s\n", s.Path, strings.Join(s.Targets, ", "))
	}
	p := m.Suite.Plan
	warm := "not recorded"
	if p.Warmup != nil {
		warm = p.Warmup.String()
	}
	fmt.Fprintf(w, "all with: model %s, seed %d, %d requests per rate and round, %s, %d round(s), warm-up %s\n",
		p.Model, p.Seed, bench.RequestsPerLevel(m.Suite), strings.Join(loadNames(p.Loads), ", "), max(p.Rounds, 1), warm)
	for _, n := range m.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w)
	if err := bench.WriteTable(w, m.Suite); err != nil {
		return err
	}
	for _, r := range m.AdaptiveRuns {
		writeAdaptiveRun(w, r.Name, r.SLO, r.Capacity)
	}
	if len(m.Adaptive) > 0 {
		fmt.Fprintln(w, "(in the grid above \"adaptive\" is the run planning for the workload's own objectives, scored after the fact; below, each cell's own run)")
		writeAdaptiveCells(w, m.Adaptive, m.Pooled)
	}
	return nil
}

// isCellRun says whether target n is an adaptive run planning for a cell
// other than the workload's own objectives.
func isCellRun(n string) bool {
	_, _, ok := ParseAdaptiveCell(n)
	return ok && n != Adaptive
}

// targetsOf names s's targets with results, in the order of its results.
func targetsOf(s *bench.Suite) []string {
	var out []string
	for _, r := range s.Results {
		if !slices.Contains(out, r.Target) {
			out = append(out, r.Target)
		}
	}
	return out
}

// only is s with the results of the targets keep accepts (copies of
// them), nil when it accepts none.
func only(s *bench.Suite, keep func(string) bool) *bench.Suite {
	p := *s.Plan
	p.Targets = nil
	out := &bench.Suite{Plan: &p, Started: s.Started, Prompts: s.Prompts}
	for _, t := range s.Plan.Targets {
		if keep(t.Name) {
			p.Targets = append(p.Targets, t)
		}
	}
	for _, r := range s.Results {
		if keep(r.Target) {
			c := *r
			out.Results = append(out.Results, &c)
		}
	}
	if len(out.Results) == 0 {
		return nil
	}
	return out
}

func loadNames(ls []bench.Load) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.String()
	}
	return out
}

// describe is "TTFT ≤ 1s, TPOT ≤ 100ms" (and ", every ITL ≤ D" with one).
func describe(s bench.SLO) string {
	out := fmt.Sprintf("TTFT ≤ %v, TPOT ≤ %v", s.TTFT, s.TPOT)
	if s.ITL > 0 {
		out += fmt.Sprintf(", every ITL ≤ %v", s.ITL)
	}
	return out
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
