package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the suite as one table, a row per target and load, then
// the SLO attainment curve of each row and each target's goodput rate when
// an SLO was given, then the failures.
func WriteTable(w io.Writer, s *Suite) error {
	p := s.Plan
	n, mp, mo := p.Workload.Requests(), 0.0, 0.0
	mp, mo = p.Workload.Stats()
	if n == 0 && s.Prompts != nil { // a saved run: its conversations are not in the JSON
		n, mp, mo = s.Prompts.Requests, s.Prompts.MeanPrompt, s.Prompts.MeanOutput
	}
	if n == 0 && s.Prompts == nil && len(s.Results) > 0 { // saved before runs recorded their prompts
		fmt.Fprintf(w, "workload %s: %d requests (counted from the records; the saved run has no prompt lengths)", p.Workload.Name, RequestsPerLevel(s))
	} else {
		fmt.Fprintf(w, "workload %s: %d requests, mean prompt %.0f and output %.0f tokens", p.Workload.Name, n, mp, mo)
	}
	if p.Workload.Clipped > 0 {
		fmt.Fprintf(w, " (%d clipped to the context)", p.Workload.Clipped)
	}
	fmt.Fprintf(w, "; %d round(s), targets alternating\n", max(p.Rounds, 1))
	if p.SLO.Set() {
		fmt.Fprintf(w, "SLO: %s (failed requests count as misses)\n", describeSLO(p.SLO))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "target\tload\tok\tfail\treq/s\tout tok/s\tTTFT p50\tTTFT p90\tTTFT p99\tTPOT p50\tTPOT p99\tITL p50\tITL p99\tE2E p99\t"
	if p.SLO.Set() {
		head += "SLO met\tgoodput\t"
	}
	fmt.Fprintln(tw, head+"P/D path\t")
	for _, r := range s.Results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%.1f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t",
			r.Target, r.Load, r.Completed, r.Failed, r.RequestThroughput, r.OutputThroughput,
			r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.TPOT.P50, r.TPOT.P99, r.ITL.P50, r.ITL.P99, r.E2E.P99)
		if p.SLO.Set() {
			fmt.Fprintf(tw, "%.0f%%\t%.2f\t", 100*r.Attained, r.Goodput)
		}
		fmt.Fprintf(tw, "%s\t\n", describePaths(r.Paths))
	}
	fmt.Fprintln(tw, "(latencies in ms; goodput in requests/s meeting the SLO)")
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range s.Results {
		if r.Resent > 0 {
			fmt.Fprintf(w, "%s at %s: %d request(s) resent on a fresh connection (the server had closed the kept-alive one before answering; not failures unless counted in fail)\n", r.Target, r.Load, r.Resent)
		}
	}
	if p.SLO.Set() {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "SLO attainment at SLO scale\t\t")
		for _, f := range SLOScales {
			fmt.Fprintf(tw, "×%g\t", f)
		}
		fmt.Fprintln(tw)
		for _, r := range s.Results {
			fmt.Fprintf(tw, "%s\t%s\t", r.Target, r.Load)
			for _, c := range r.Curve {
				fmt.Fprintf(tw, "%.0f%%\t", 100*c.Attainment)
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := WriteBreakdowns(w, s); err != nil {
		return err
	}
	header := false
	for _, c := range s.Capacity {
		if c.Bound == BoundNone {
			continue
		}
		if !header {
			header = true
			fmt.Fprintf(w, "goodput rate: the highest tested arrival rate at which %.0f%% of requests met the SLO (with a linear estimate between tested rates); per rate: completed req/s, output tok/s, SLO met:\n", 100*c.Goal)
		}
		fmt.Fprintf(w, "  %s: %s\n", c.Target, c)
		fmt.Fprintf(w, "  %s  per rate: %s\n", strings.Repeat(" ", len(c.Target)), c.Levels())
	}
	if len(s.Grid) > 0 {
		names := make([]string, len(s.Grid[0].Capacities))
		for i, c := range s.Grid[0].Capacities {
			names[i] = c.Target
		}
		fmt.Fprintf(w, "goodput rate under each pair of objectives (TTFT SLO scaled down the rows, TPOT SLO across; each cell: the best target, then the goodput rates of %s;\n"+
			"each rate's attainment pools %s):\n", strings.Join(names, "/"), PooledNote(s))
		WriteSLOGrid(w, s.Grid)
	}
	for _, r := range s.Results {
		for i, e := range r.Errors {
			if i == 3 {
				fmt.Fprintf(w, "  %s %s: ... and %d more distinct errors\n", r.Target, r.Load, len(r.Errors)-i)
				break
			}
			fmt.Fprintf(w, "  %s %s: failed %d×: %s\n", r.Target, r.Load, e.Count, e.Error)
		}
	}
	return nil
}

func describeSLO(s SLO) string {
	var parts []string
	if s.TTFT > 0 {
		parts = append(parts, "TTFT ≤ "+s.TTFT.String())
	}
	if s.TPOT > 0 {
		parts = append(parts, "TPOT ≤ "+s.TPOT.String())
	}
	if s.ITL > 0 {
		parts = append(parts, "every ITL ≤ "+s.ITL.String())
	}
	return strings.Join(parts, " and ")
}

func describePaths(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
