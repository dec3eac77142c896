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
	// AtLeast says a rate of the comparison is a lower bound: every tested
	// rate met the goal.
	AtLeast bool `json:"at_least,omitempty"`
}

// adaptiveCells compares the adaptive configuration with the best static
// one in every cell of grid; nil without an adaptive configuration.
func adaptiveCells(grid []bench.GridCell) []AdaptiveCell {
	var out []AdaptiveCell
	for _, g := range grid {
		c := AdaptiveCell{TTFTScale: g.TTFTScale, TPOTScale: g.TPOTScale}
		found := false
		for _, k := range g.Capacities {
			v := gridRate(k)
			if k.Target == Adaptive {
				c.Adaptive, found = v, true
			} else if v > c.BestStatic*(1+1e-9) {
				c.BestStatic, c.Static = v, []string{k.Target}
			} else if v > 0 && v >= c.BestStatic*(1-1e-9) {
				c.Static = append(c.Static, k.Target)
			}
			if v > 0 && k.Bound == "at least" {
				c.AtLeast = true
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
	fmt.Fprintln(w, "adaptive against the best static configuration per cell (its goodput rate ÷ the best other's; \"*\": above every static one,")
	fmt.Fprintln(w, "\"≥\": a rate in the cell is a lower bound, every tested rate met the goal; \"none\": no configuration met it; \"0\": only adaptive missed):")
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
		if c.AtLeast && c.BestStatic > 0 {
			text = "≥" + text
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
