package experiment

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tandem-serve/tandem/internal/bench"
)

// AdaptiveCell is the adaptive configuration against the static ones in
// one cell of the SLO grid: goodput rates are the grid's estimates (the
// interpolated rate, 0 when even the lowest tested rate missed the goal).
type AdaptiveCell struct {
	TTFTScale float64 `json:"ttft_scale"`
	TPOTScale float64 `json:"tpot_scale"`
	// Adaptive is the adaptive configuration's goodput rate.
	Adaptive float64 `json:"adaptive"`
	// BestStatic is the highest goodput rate of the other configurations,
	// and Static names those that reach it.
	BestStatic float64  `json:"best_static"`
	Static     []string `json:"best_static_configs,omitempty"`
	// Ratio is Adaptive / BestStatic (0 when no static configuration met
	// the goal at any tested rate).
	Ratio float64 `json:"ratio"`
	// AdaptiveAtLeast and StaticAtLeast say that adaptive's rate, or the
	// best static one's, is a lower bound: every tested rate met the goal.
	// Ratio is then a lower bound, an upper bound, or (both) unknown.
	AdaptiveAtLeast bool `json:"adaptive_at_least,omitempty"`
	StaticAtLeast   bool `json:"best_static_at_least,omitempty"`
}

// adaptiveCells compares the adaptive configuration with the best static
// one in every cell of grid; nil without an adaptive configuration.
func adaptiveCells(grid []bench.GridCell) []AdaptiveCell {
	var out []AdaptiveCell
	for _, g := range grid {
		c := AdaptiveCell{TTFTScale: g.TTFTScale, TPOTScale: g.TPOTScale}
		found := false
		for _, k := range g.Capacities {
			v, atLeast := gridRate(k), k.Bound == bench.BoundAtLeast
			switch {
			case k.Target == Adaptive:
				c.Adaptive, c.AdaptiveAtLeast, found = v, atLeast && v > 0, true
			case v > c.BestStatic*(1+1e-9):
				c.BestStatic, c.Static, c.StaticAtLeast = v, []string{k.Target}, atLeast
			case v > 0 && v >= c.BestStatic*(1-1e-9):
				c.Static = append(c.Static, k.Target)
				c.StaticAtLeast = c.StaticAtLeast || atLeast
			}
		}
		if !found {
			return nil
		}
		if c.BestStatic > 0 {
			c.Ratio = c.Adaptive / c.BestStatic
		}
		out = append(out, c)
	}
	return out
}

// AdaptiveCellName is the target name of the adaptive configuration's run
// planning for the workload's TTFT objective times ttft and TPOT objective
// times tpot in a phased comparison: Adaptive for the workload's own
// objectives, else "adaptive-ttft0.5-tpot2" (saved as
// results-WORKLOAD-NAME.json).
func AdaptiveCellName(ttft, tpot float64) string {
	if ttft == 1 && tpot == 1 {
		return Adaptive
	}
	return fmt.Sprintf("%s-ttft%g-tpot%g", Adaptive, ttft, tpot)
}

// ParseAdaptiveCell is the cell an AdaptiveCellName names; false for any
// other name.
func ParseAdaptiveCell(name string) (ttft, tpot float64, ok bool) {
	if name == Adaptive {
		return 1, 1, true
	}
	rest, ok := strings.CutPrefix(name, Adaptive+"-ttft")
	if !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(rest, "-tpot")
	if !ok {
		return 0, 0, false
	}
	ft, err1 := strconv.ParseFloat(a, 64)
	fp, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil || !(ft > 0) || !(fp > 0) || AdaptiveCellName(ft, fp) != name {
		return 0, 0, false
	}
	return ft, fp, true
}

// adaptiveCell puts an adaptive run (run, one target, scored under the
// objectives of the cell ttft × tpot it planned for) beside the static
// configurations (staticOnly, scored under the workload's own objectives)
// in that cell: its capacity, named Adaptive, and the grid cell with the
// static configurations' capacities and it last. ok is false when
// staticOnly has no SLO grid (no static configuration, or no objectives).
func adaptiveCell(staticOnly, run *bench.Suite, ttft, tpot float64) (c bench.Capacity, cell bench.GridCell, ok bool) {
	if len(run.Capacity) > 0 {
		c = run.Capacity[0]
	}
	c.Target = Adaptive
	grid := bench.SLOGrid(staticOnly, []float64{ttft}, []float64{tpot})
	if len(grid) != 1 {
		return c, cell, false
	}
	grid[0].Capacities = append(grid[0].Capacities, c)
	return c, grid[0], true
}

// writeAdaptiveRun prints one adaptive run's goodput rate c under the
// objectives slo of the cell it planned for.
func writeAdaptiveRun(w io.Writer, name string, slo bench.SLO, c bench.Capacity) {
	fmt.Fprintf(w, "  %s (TTFT ≤ %v, TPOT ≤ %v): goodput rate %s; %s\n", name, slo.TTFT, slo.TPOT,
		rateText(c.Bound, c.GoodputRate, c.FirstMiss, fmt.Sprintf("%.3g", c.Interpolated)), c.Levels())
}

// gridRate is the SLO grid's estimate of a capacity's goodput rate: the
// interpolated rate, or 0 when even the lowest tested rate missed.
func gridRate(c bench.Capacity) float64 {
	switch c.Bound {
	case bench.BoundBetween, bench.BoundAtLeast, bench.BoundSearch:
		return c.Interpolated
	}
	return 0
}

// writeAdaptiveCells prints, per cell of the SLO grid, the adaptive
// configuration's goodput rate as a fraction of the best static one's, and
// how many cells meet 0.9× and how many it wins outright. pooled says how
// many requests each rate's attainment pools (bench.PooledNote). The
// cells are laid out by their scales, TTFT down and TPOT across in the
// order they first appear; a pair with no cell is left blank.
func writeAdaptiveCells(w io.Writer, cells []AdaptiveCell, pooled string) {
	if len(cells) == 0 {
		return
	}
	fmt.Fprintln(w, "adaptive against the best static configuration per cell (its goodput rate ÷ the best other's; \"*\": above every static one;")
	fmt.Fprintln(w, "\"≥x\" or \"≤x\": a bound, one side met the goal at every tested rate; \"top\": both did; \"none\": no configuration met it at the lowest rate):")
	if pooled != "" {
		fmt.Fprintf(w, "(each rate's attainment pools %s)\n", pooled)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var ttfts, tpots []float64
	for _, c := range cells {
		if !slices.Contains(ttfts, c.TTFTScale) {
			ttfts = append(ttfts, c.TTFTScale)
		}
		if !slices.Contains(tpots, c.TPOTScale) {
			tpots = append(tpots, c.TPOTScale)
		}
	}
	head := []string{"TTFT ×  \\  TPOT ×"}
	for _, s := range tpots {
		head = append(head, fmt.Sprintf("%g", s))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	compared, near, above := 0, 0, 0
	for _, ft := range ttfts {
		row := []string{fmt.Sprintf("%g", ft)}
		for _, fp := range tpots {
			i := slices.IndexFunc(cells, func(c AdaptiveCell) bool { return c.TTFTScale == ft && c.TPOTScale == fp })
			if i < 0 {
				row = append(row, "")
				continue
			}
			c := cells[i]
			text := "none"
			switch {
			case c.BestStatic > 0:
				compared++
				text = fmt.Sprintf("%.2f", c.Ratio)
				switch {
				case c.AdaptiveAtLeast && c.StaticAtLeast:
					text = "top"
				case c.AdaptiveAtLeast:
					text = "≥" + text
				case c.StaticAtLeast && c.Adaptive > 0:
					text = "≤" + text
				}
				if c.Ratio >= 0.9 {
					near++
				}
				if c.Adaptive > c.BestStatic*(1+1e-9) {
					above++
					text += "*"
				}
			case c.Adaptive > 0:
				text = "only adaptive"
				above++
			}
			row = append(row, text)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "adaptive is at least 0.9× the best static configuration in %d of the %d cells some static configuration met, and above every static one in %d\n",
		near, compared, above)
}
