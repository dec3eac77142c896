// Package plot draws a benchmark suite's figures as PNG and SVG with
// gonum.org/v1/plot: latency CDFs per target, goodput and tail latencies
// against the arrival rate, and inter-token latency over time (where a
// prefill stalling the decodes shows as spikes).
package plot

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/tandem-serve/tandem/internal/bench"
)

// Suite writes the figures of s into dir, each file name starting with
// prefix, and returns the files written. The rate figure needs at least two
// rate levels and is skipped otherwise; a suite with no target or no
// result (a phased experiment that ran only adaptive's cells of other
// objectives) has nothing to draw and writes nothing.
func Suite(dir, prefix string, s *bench.Suite) ([]string, error) {
	if len(s.Plan.Targets) == 0 || len(s.Results) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	add := func(name string, rows [][]*plot.Plot, w, h vg.Length) error {
		fs, err := save(filepath.Join(dir, prefix+name), rows, w, h)
		files = append(files, fs...)
		return err
	}
	title := s.Plan.Workload.Name
	if err := add("latency-cdf", [][]*plot.Plot{
		{cdf(s, "TTFT", title, ttft), cdf(s, "TPOT", title, tpot)},
		{cdf(s, "ITL", title, itl), cdf(s, "E2E", title, e2e)},
	}, 26*vg.Centimeter, 20*vg.Centimeter); err != nil {
		return files, err
	}
	if rows := vsRate(s, title); rows != nil {
		if err := add("vs-rate", rows, 26*vg.Centimeter, 20*vg.Centimeter); err != nil {
			return files, err
		}
	}
	var rows [][]*plot.Plot
	for _, t := range s.Plan.Targets {
		rows = append(rows, []*plot.Plot{itlOverTime(s, t.Name, title)})
	}
	if err := add("itl-over-time", rows, 26*vg.Centimeter, vg.Length(len(rows))*7*vg.Centimeter); err != nil {
		return files, err
	}
	return files, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ttft(r *bench.Record) []float64 { return []float64{ms(r.TTFT)} }
func e2e(r *bench.Record) []float64  { return []float64{ms(r.E2E)} }
func tpot(r *bench.Record) []float64 {
	if r.OutputTokens < 2 {
		return nil
	}
	return []float64{ms((r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1))}
}
func itl(r *bench.Record) []float64 {
	out := make([]float64, len(r.ITL))
	for i, d := range r.ITL {
		out[i] = ms(d)
	}
	return out
}

// cdf is the empirical CDF of one metric, a line per target and load, over
// successful requests, on a log time axis.
func cdf(s *bench.Suite, metric, title string, get func(*bench.Record) []float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = metric + " CDF, " + title
	p.X.Label.Text = metric + " (ms, log)"
	p.Y.Label.Text = "fraction of " + map[bool]string{true: "gaps", false: "requests"}[metric == "ITL"]
	defer logAxis(&p.X)
	p.Legend.Top, p.Legend.Left = false, true
	p.Legend.YOffs = vg.Centimeter
	for _, r := range s.Results {
		var xs []float64
		for j := range r.Records {
			if r.Records[j].Err == "" {
				for _, x := range get(&r.Records[j]) {
					xs = append(xs, max(x, 0.01))
				}
			}
		}
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		pts := make(plotter.XYs, 0, min(len(xs), 2000))
		step := max(1, len(xs)/2000)
		for k := 0; k < len(xs); k += step {
			pts = append(pts, plotter.XY{X: xs[k], Y: float64(k+1) / float64(len(xs))})
		}
		pts = append(pts, plotter.XY{X: xs[len(xs)-1], Y: 1})
		l, err := plotter.NewLine(pts)
		if err != nil {
			continue
		}
		l.Color = colorOf(s, r.Target)
		l.Dashes = dashesOf(s, r.Load)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Target+" "+r.Load.String(), l)
	}
	return p
}

// vsRate is goodput, SLO attainment and tail latencies against the arrival
// rate, a line per target; nil with fewer than two rates.
func vsRate(s *bench.Suite, title string) [][]*plot.Plot {
	rates := map[float64]bool{}
	for _, r := range s.Results {
		if r.Load.Rate > 0 {
			rates[r.Load.Rate] = true
		}
	}
	if len(rates) < 2 {
		return nil
	}
	mk := func(ylabel string, get func(*bench.Result) float64) *plot.Plot {
		p := plot.New()
		p.Title.Text = ylabel + ", " + title
		p.X.Label.Text = "arrival rate (req/s)"
		p.Y.Label.Text = ylabel
		p.Legend.Top, p.Legend.Left = true, true
		for _, t := range s.Plan.Targets {
			var pts plotter.XYs
			for _, r := range s.Results {
				if r.Target == t.Name && r.Load.Rate > 0 {
					pts = append(pts, plotter.XY{X: r.Load.Rate, Y: get(r)})
				}
			}
			slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				continue
			}
			l.Color, sc.Color = colorOf(s, t.Name), colorOf(s, t.Name)
			l.Width = vg.Points(1.5)
			p.Add(l, sc)
			p.Legend.Add(t.Name, l, sc)
		}
		return p
	}
	top := mk("goodput (req/s meeting the SLO)", func(r *bench.Result) float64 { return r.Goodput })
	if !s.Plan.SLO.Set() {
		top = mk("throughput (req/s)", func(r *bench.Result) float64 { return r.RequestThroughput })
	}
	return [][]*plot.Plot{
		{top, mk("TTFT p90 (ms)", func(r *bench.Result) float64 { return r.TTFT.P90 })},
		{mk("TPOT p99 (ms)", func(r *bench.Result) float64 { return r.TPOT.P99 }), mk("ITL p99 (ms)", func(r *bench.Result) float64 { return r.ITL.P99 })},
	}
}

// itlOverTime scatters every inter-token gap of one target's busiest load
// (highest rate, else the last) at the moment it ended.
func itlOverTime(s *bench.Suite, target, title string) *plot.Plot {
	var pick *bench.Result
	for _, r := range s.Results {
		if r.Target == target && (pick == nil || r.Load.Rate >= pick.Load.Rate) {
			pick = r
		}
	}
	p := plot.New()
	if pick == nil {
		return p
	}
	p.Title.Text = fmt.Sprintf("inter-token gaps over time: %s, %s, %s (round 1)", target, pick.Load, title)
	p.X.Label.Text = "time since the level started (s)"
	p.Y.Label.Text = "gap (ms, log)"
	var pts plotter.XYs
	for _, rec := range pick.Records {
		if rec.Round != 0 || rec.Err != "" {
			continue
		}
		t := rec.Start + rec.TTFT
		for _, g := range rec.ITL {
			t += g
			pts = append(pts, plotter.XY{X: t.Seconds(), Y: max(ms(g), 0.01)})
		}
	}
	if len(pts) == 0 {
		return p
	}
	sc, err := plotter.NewScatter(pts)
	if err == nil {
		sc.GlyphStyle.Radius = vg.Points(1)
		sc.GlyphStyle.Color = colorOf(s, target)
		p.Add(sc)
		logAxis(&p.Y)
	}
	return p
}

// logAxis puts a on a log scale when it has data (a log scale of an empty
// or one-point axis panics in gonum/plot), widening a degenerate range.
func logAxis(a *plot.Axis) {
	if a.Min <= 0 || a.Max <= 0 || math.IsInf(a.Min, 0) || math.IsInf(a.Max, 0) {
		return
	}
	if a.Max/a.Min < 10 {
		mid := math.Sqrt(a.Min * a.Max)
		a.Min, a.Max = mid/4, mid*4
	}
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.LogTicks{Prec: -1}
}

func colorOf(s *bench.Suite, target string) color.Color {
	for i, t := range s.Plan.Targets {
		if t.Name == target {
			return plotutil.Color(i)
		}
	}
	return color.Black
}

func dashesOf(s *bench.Suite, l bench.Load) []vg.Length {
	for i, x := range s.Plan.Loads {
		if x == l {
			return plotutil.Dashes(i)
		}
	}
	return nil
}

// save draws rows of plots tiled on one page as base.png and base.svg.
func save(base string, rows [][]*plot.Plot, w, h vg.Length) ([]string, error) {
	if len(rows) == 0 || len(rows[0]) == 0 {
		return nil, fmt.Errorf("drawing %s: no plots to tile", base)
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: len(rows[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	png := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	svg := vgsvg.New(w, h)
	for _, c := range []vg.CanvasSizer{png, svg} {
		dc := draw.New(c)
		dc.SetColor(color.White)
		dc.Fill(dc.Rectangle.Path())
		canv := plot.Align(rows, tiles, dc)
		for i := range rows {
			for j := range rows[i] {
				rows[i][j].Draw(canv[i][j])
			}
		}
	}
	var files []string
	write := func(name string, wt func(*os.File) error) error {
		fh, err := os.Create(name)
		if err != nil {
			return err
		}
		if err := wt(fh); err != nil {
			fh.Close()
			return fmt.Errorf("writing %s: %w", name, err)
		}
		files = append(files, name)
		return fh.Close()
	}
	if err := write(base+".png", func(f *os.File) error { _, err := (vgimg.PngCanvas{Canvas: png}).WriteTo(f); return err }); err != nil {
		return files, err
	}
	if err := write(base+".svg", func(f *os.File) error { _, err := svg.WriteTo(f); return err }); err != nil {
		return files, err
	}
	return files, nil
}

// Ratio writes dir/base.png and .svg: for each check (a workload at N
// engines) a panel of goodput against the number of prefill engines P — the
// model's curve min(P·prefill rate, (N−P)·decode rate) dashed, its best
// split marked with a triangle, and each measured split's goodput rate as a
// point with a bar up to the lowest rate that missed (the search's
// bracket), the measured best ringed. Rates are multiplied by scale (1/speed
// for a simulation run at speed). Panels are laid out two to a row.
func Ratio(dir, base string, checks []bench.RatioCheck, scale float64) ([]string, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cols := min(len(checks), 2)
	var rows [][]*plot.Plot
	for i, c := range checks {
		if i%cols == 0 {
			rows = append(rows, nil)
		}
		rows[len(rows)-1] = append(rows[len(rows)-1], ratioPanel(c, scale))
	}
	if last := rows[len(rows)-1]; len(last) < cols {
		empty := plot.New()
		empty.HideAxes()
		rows[len(rows)-1] = append(last, empty)
	}
	return save(filepath.Join(dir, base), rows, vg.Length(cols)*13*vg.Centimeter, vg.Length(len(rows))*9*vg.Centimeter)
}

func ratioPanel(c bench.RatioCheck, scale float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, N = %d engines", c.Workload, c.N)
	p.X.Label.Text = "prefill engines P (decode D = N − P)"
	p.Y.Label.Text = "goodput rate (req/s)"
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Min, p.X.Max = 0, float64(c.N)
	p.Y.Min = 0
	// Head room above the data for the legend.
	top := c.Predicted.Goodput
	for _, s := range c.Splits {
		top = math.Max(top, math.Max(s.Measured, s.FirstMiss))
	}
	p.Y.Max = 1.5 * top * scale
	var curve plotter.XYs
	for _, s := range c.Curve {
		curve = append(curve, plotter.XY{X: float64(s.P), Y: s.Goodput * scale})
	}
	if l, err := plotter.NewLine(curve); err == nil {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = plotutil.Color(1)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add("model", l)
	}
	if pred, err := plotter.NewScatter(plotter.XYs{{X: float64(c.Predicted.P), Y: c.Predicted.Goodput * scale}}); err == nil {
		pred.GlyphStyle.Shape = draw.TriangleGlyph{}
		pred.GlyphStyle.Radius = vg.Points(6)
		pred.GlyphStyle.Color = plotutil.Color(1)
		p.Add(pred)
		p.Legend.Add(fmt.Sprintf("predicted best %dP:%dD", c.Predicted.P, c.Predicted.D), pred)
	}
	var meas plotter.XYs
	for _, s := range c.Splits {
		meas = append(meas, plotter.XY{X: float64(s.P), Y: s.Measured * scale})
		if s.FirstMiss > s.Measured {
			bar, err := plotter.NewLine(plotter.XYs{{X: float64(s.P), Y: s.Measured * scale}, {X: float64(s.P), Y: s.FirstMiss * scale}})
			if err == nil {
				bar.Color = plotutil.Color(0)
				bar.Width = vg.Points(1)
				p.Add(bar)
			}
		}
	}
	if l, sc, err := plotter.NewLinePoints(meas); err == nil {
		l.Color, sc.Color = plotutil.Color(0), plotutil.Color(0)
		l.Width = vg.Points(1.5)
		sc.GlyphStyle.Radius = vg.Points(3)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		p.Add(l, sc)
		p.Legend.Add("measured (bar: up to the first rate missed)", l, sc)
	}
	if c.Best.Measured > 0 {
		if best, err := plotter.NewScatter(plotter.XYs{{X: float64(c.Best.P), Y: c.Best.Measured * scale}}); err == nil {
			best.GlyphStyle.Shape = draw.RingGlyph{}
			best.GlyphStyle.Radius = vg.Points(7)
			best.GlyphStyle.Color = plotutil.Color(0)
			p.Add(best)
			p.Legend.Add(fmt.Sprintf("measured best %dP:%dD", c.Best.P, c.Best.D), best)
		}
	}
	return p
}
