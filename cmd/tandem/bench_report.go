package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/experiment"
)

// runBenchReport is `tandem bench report`: it re-reads runs saved by
// tandem bench --json or tandem bench experiment (results-*.json) and
// prints their tables again, under the SLO they were run with or under
// others given as flags: attainment, goodput, the goodput rate per target
// and the grid of goodput rates over scaled TTFT and TPOT objectives are
// all recomputed from the recorded requests, so one run answers for many
// SLOs without sending a request.
func runBenchReport(args []string) error { return benchReport(os.Stdout, args) }

// benchReport is runBenchReport writing to out.
func benchReport(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem bench report [--slo-ttft D] [--slo-tpot D] [--slo-itl D] [--goal F] [--json OUT] [--merge] FILE.json ...\n\n"+
			"Prints a saved run's tables (from tandem bench --json, or an experiment's results-*.json),\n"+
			"with its SLO figures recomputed from the recorded requests: under the run's own SLO, or\n"+
			"with the objectives given here in its place (an objective not given keeps the run's).\n\n"+
			"With --merge the files are one run of one workload saved in parts with the same seed, e.g.\n"+
			"the SLO grid's static configurations from one --out and the adaptive one's cells from another:\n"+
			"  tandem bench report --merge statics/results-chat.json adaptive/results-chat*.json\n"+
			"It checks that they are comparable (workload and prompts, seed, requests, rates, rounds,\n"+
			"warm-up, goal, SLO; engines and chunk budget where a summary.json sits beside the files),\n"+
			"then prints them as one run: the table, the SLO grid and, with static and adaptive\n"+
			"configurations, adaptive against the best static one in each cell it ran for.\n\n")
		fs.PrintDefaults()
	}
	var (
		ttft  = fs.Duration("slo-ttft", 0, "SLO on time to first token (default: the run's)")
		tpot  = fs.Duration("slo-tpot", 0, "SLO on time per output token (default: the run's)")
		itl   = fs.Duration("slo-itl", 0, "SLO on every inter-token gap (default: the run's)")
		goal  = fs.Float64("goal", 0, "fraction of requests that must meet the SLO for a rate to count (default: the run's)")
		jsonF = fs.String("json", "", "write the re-scored run (one file, or the merged run with --merge) as JSON to this file")
		merge = fs.Bool("merge", false, "report the files as one run of one workload saved in parts (see above)")
		pdFor = fs.String("pd-model", "", "also fit the P:D ratio model (as tandem bench experiment pd prints it) to this target's requests, e.g. pd")
		seqs  = fs.Int("max-num-seqs", 64, "with --pd-model: the decode engine's --max-num-seqs")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("no run to report: give the JSON file(s) of tandem bench --json or an experiment's results-*.json")
	}
	if *goal < 0 || *goal > 1 {
		return fmt.Errorf("--goal %v: want a fraction in (0, 1]", *goal)
	}
	if *jsonF != "" && fs.NArg() > 1 && !*merge {
		return fmt.Errorf("--json writes one run: give one file, or --merge to report the files as one run")
	}
	if *merge {
		if *pdFor != "" {
			return fmt.Errorf("--pd-model fits one run's requests: give it without --merge")
		}
		var files []experiment.RunFile
		for _, path := range fs.Args() {
			s, err := readSuiteFile(path)
			if err != nil {
				return err
			}
			rf := experiment.RunFile{Path: path, Suite: s}
			// The experiment's summary.json beside it, if any, says its
			// engines and chunk budget.
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(path), "summary.json")); err == nil {
				var sum experiment.PDSummary
				if err := json.Unmarshal(b, &sum); err != nil {
					return fmt.Errorf("%s: %w (move it away to merge without it)", filepath.Join(filepath.Dir(path), "summary.json"), err)
				}
				rf.Summary = &sum
			}
			files = append(files, rf)
		}
		m, err := experiment.MergeRuns(files, bench.SLO{TTFT: *ttft, TPOT: *tpot, ITL: *itl}, *goal)
		if err != nil {
			return err
		}
		if err := m.Write(out); err != nil {
			return err
		}
		if *jsonF != "" {
			return bench.WriteJSONFile(*jsonF, m)
		}
		return nil
	}
	for i, path := range fs.Args() {
		s, err := readSuiteFile(path)
		if err != nil {
			return err
		}
		slo := s.Plan.SLO
		if *ttft > 0 {
			slo.TTFT = *ttft
		}
		if *tpot > 0 {
			slo.TPOT = *tpot
		}
		if *itl > 0 {
			slo.ITL = *itl
		}
		s.Rescore(slo, *goal)
		if i > 0 {
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "== %s\n", path)
		if err := bench.WriteTable(out, s); err != nil {
			return err
		}
		if *pdFor != "" {
			fmt.Fprintln(out)
			bench.WritePDModelHeader(out)
			m := bench.ModelPD(s, *pdFor, *seqs)
			m.Write(out, s.Plan.SLO)
		}
		if *jsonF != "" {
			if err := bench.WriteJSONFile(*jsonF, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// readSuiteFile reads a saved run (bench.ReadSuite) from path.
func readSuiteFile(path string) (*bench.Suite, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := bench.ReadSuite(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
