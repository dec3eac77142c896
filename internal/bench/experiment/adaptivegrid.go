package experiment

import (
	"fmt"
	"io"
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
			v, atLeast := gridRate(k), k.Bound == "at least"
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

// gridRate is the SLO grid's estimate of a capacity's goodput rate: the
// interpolated rate, or 0 when even the lowest tested rate missed.
func gridRate(c bench.Capacity) float64 {
	switch c.Bound {
	case "between", "at least", "search":
		return c.Interpolated
	}
	return 0
}

// writeAdaptiveCells prints, per cell of the SLO grid, the adaptive
// configuration's goodput rate as a fraction of the best static one's, and
// how many cells meet 0.9× and how many it wins outright.
func writeAdaptiveCells(w io.Writer, cells []AdaptiveCell) {
	if len(cells) == 0 {
		return
	}
	fmt.Fprintln(w, "adaptive against the best static configuration per cell (its goodput rate ÷ the best other's; \"*\": above every static one;")
	fmt.Fprintln(w, "\"≥x\" or \"≤x\": a bound, one side met the goal at every tested rate; \"top\": both did; \"none\": no configuration met it at the lowest rate):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var tpots []float64
	for _, c := range cells {
		if c.TTFTScale != cells[0].TTFTScale {
			break
		}
		tpots = append(tpots, c.TPOTScale)
	}
	head := []string{"TTFT ×  \\  TPOT ×"}
	for _, s := range tpots {
		head = append(head, fmt.Sprintf("%g", s))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	row := []string{}
	compared, near, above := 0, 0, 0
	for i, c := range cells {
		if i%len(tpots) == 0 {
			row = []string{fmt.Sprintf("%g", c.TTFTScale)}
		}
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
		if len(row) == len(tpots)+1 {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "adaptive is at least 0.9× the best static configuration in %d of the %d cells some static configuration met, and above every static one in %d\n",
		near, compared, above)
}
