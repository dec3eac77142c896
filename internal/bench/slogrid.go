package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// GridScales are the factors of the TTFT and of the TPOT objective an SLO
// grid is computed at.
var GridScales = []float64{0.25, 0.5, 1, 2, 4}

// GridCell is one pair of objectives of an SLO grid: the plan's TTFT SLO
// times TTFTScale and its TPOT SLO times TPOTScale (its ITL objective, if
// any, unscaled), with every target's goodput rate under that pair.
type GridCell struct {
	TTFTScale  float64    `json:"ttft_scale"`
	TPOTScale  float64    `json:"tpot_scale"`
	SLO        SLO        `json:"slo"`
	Capacities []Capacity `json:"capacities"`
	// Best names the targets with the highest goodput rate estimate (more
	// than one on a tie); empty when no target met the goal at any tested
	// rate.
	Best []string `json:"best,omitempty"`
}

// SLOGrid recomputes each target's goodput rate of s under every pair of
// scaled TTFT and TPOT objectives, from the recorded requests: which
// configuration wins depends on which objective is tight. A single SLO
// scale (SLOScales) tightens both objectives together and cannot show that
// disaggregation wins when TPOT is strict and TTFT relaxed while a
// colocated engine wins the other way round (TaiChi, arXiv 2508.01989).
// It returns nil when the plan has no TTFT and TPOT objectives or no rate
// levels.
func SLOGrid(s *Suite, ttftScales, tpotScales []float64) []GridCell {
	if s.Plan == nil || s.Plan.SLO.TTFT <= 0 || s.Plan.SLO.TPOT <= 0 {
		return nil
	}
	if !slices.ContainsFunc(s.Results, func(r *Result) bool { return r.Load.Rate > 0 }) {
		return nil
	}
	goal := DefaultGoal
	if s.Plan.Goal > 0 {
		goal = s.Plan.Goal
	}
	base := s.Plan.SLO
	var cells []GridCell
	for _, ft := range ttftScales {
		for _, fp := range tpotScales {
			slo := SLO{TTFT: scaleDur(base.TTFT, ft), TPOT: scaleDur(base.TPOT, fp), ITL: base.ITL}
			cell := GridCell{TTFTScale: ft, TPOTScale: fp, SLO: slo, Capacities: capacitiesUnder(s, slo, goal)}
			cell.Best = bestTargets(cell.Capacities)
			cells = append(cells, cell)
		}
	}
	return cells
}

func scaleDur(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// capacitiesUnder is Capacities with the attainment of every rate level
// recomputed under slo.
func capacitiesUnder(s *Suite, slo SLO, goal float64) []Capacity {
	var out []Capacity
	for _, t := range targetNames(s) {
		c := Capacity{Target: t, Goal: goal}
		for _, r := range s.Results {
			if r.Target != t || r.Load.Rate <= 0 {
				continue
			}
			p := r.point()
			var met int
			p.Attainment, met = Attainment(slo, r.Records)
			p.Goodput = 0
			if r.Report != nil && r.Duration > 0 {
				p.Goodput = float64(met) / r.Duration
			}
			c.Points = append(c.Points, p)
		}
		slices.SortStableFunc(c.Points, func(a, b SearchPoint) int { return cmp.Compare(a.Rate, b.Rate) })
		c.fill(c.Points, goal)
		out = append(out, c)
	}
	return out
}

// goodputEstimate ranks a capacity: its interpolated goodput rate, or 0
// when even the lowest tested rate missed the goal.
func goodputEstimate(c Capacity) float64 {
	switch c.Bound {
	case BoundBetween, BoundAtLeast, BoundSearch:
		return c.Interpolated
	}
	return 0
}

// bestTargets names the capacities with the highest goodput estimate.
func bestTargets(cs []Capacity) []string {
	top := 0.0
	for _, c := range cs {
		top = max(top, goodputEstimate(c))
	}
	if top == 0 {
		return nil
	}
	var best []string
	for _, c := range cs {
		if goodputEstimate(c) >= top*(1-1e-9) {
			best = append(best, c.Target)
		}
	}
	return best
}

// shortRate is a capacity's goodput rate in a few characters: "1.32",
// "≥0.3" (every tested rate met the goal) or "<0.1" (none did).
func shortRate(c Capacity) string {
	switch c.Bound {
	case BoundBelow:
		return fmt.Sprintf("<%.3g", c.FirstMiss)
	case BoundAtLeast:
		return fmt.Sprintf("≥%.3g", c.GoodputRate)
	case BoundNone:
		return "-"
	}
	return fmt.Sprintf("%.3g", c.Interpolated)
}

// WriteSLOGrid prints cells (from SLOGrid) as a matrix, TTFT scales down
// and TPOT scales across, each cell naming the best target and its goodput
// rate, then every target's rate in the cell.
func WriteSLOGrid(w io.Writer, cells []GridCell) {
	if len(cells) == 0 {
		return
	}
	var ttfts, tpots []float64
	for _, c := range cells {
		if !slices.Contains(ttfts, c.TTFTScale) {
			ttfts = append(ttfts, c.TTFTScale)
		}
		if !slices.Contains(tpots, c.TPOTScale) {
			tpots = append(tpots, c.TPOTScale)
		}
	}
	at := func(ft, fp float64) *GridCell {
		for i := range cells {
			if cells[i].TTFTScale == ft && cells[i].TPOTScale == fp {
				return &cells[i]
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  TTFT SLO \\ TPOT SLO")
	for _, fp := range tpots {
		fmt.Fprintf(tw, "\t×%g (%s)", fp, at(ttfts[0], fp).SLO.TPOT)
	}
	fmt.Fprintln(tw)
	for _, ft := range ttfts {
		fmt.Fprintf(tw, "  ×%g (%s)", ft, at(ft, tpots[0]).SLO.TTFT)
		for _, fp := range tpots {
			c := at(ft, fp)
			if c == nil {
				fmt.Fprint(tw, "\t")
				continue
			}
			fmt.Fprintf(tw, "\t%s", cellText(c))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

// cellText is "best rate (other rate, ...)" or "none (<r)".
func cellText(c *GridCell) string {
	if len(c.Best) == 0 {
		var lowest float64
		for _, cp := range c.Capacities {
			if cp.FirstMiss > 0 && (lowest == 0 || cp.FirstMiss < lowest) {
				lowest = cp.FirstMiss
			}
		}
		return fmt.Sprintf("none <%.3g", lowest)
	}
	var rates []string
	for _, cp := range c.Capacities {
		rates = append(rates, shortRate(cp))
	}
	return fmt.Sprintf("%s %s", strings.Join(c.Best, "="), strings.Join(rates, "/"))
}
