package planner

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// A shift of the traffic mix: the window's recent part (its last
// shiftShare) against the part before it. When their prompt lengths (the
// uncached part) or output lengths differ beyond what chance gives two
// samples of one mix (a two-sample Kolmogorov–Smirnov test at level
// shiftAlpha), the model is fitted to the requests since the shift alone
// until the window has passed it: the window would otherwise hold the old
// mix for most of its length, and a split fitted to it would follow the
// new one a window late. Chance alone
// detects a shift in about one decision in ten thousand, and fitting a
// steady mix to its recent part gives nearly the same split, which the
// hysteresis then holds.
const (
	shiftShare = 4 // the recent part is the window's last quarter
	shiftAlpha = 1e-4
	// minShiftSample is the fewest requests on either side a shift is
	// judged on.
	minShiftSample = 8
)

// shiftCritical is the KS critical value's coefficient at shiftAlpha:
// sqrt(−ln(α/2)/2).
var shiftCritical = math.Sqrt(-math.Log(shiftAlpha/2) / 2)

// view is the part of the window the model is fitted to at now: the
// requests since the last shift of the mix, or the whole window when none
// happened within it (why says which shift; "" when none). A shift is
// judged within the current mix: its recent part against the part before.
// from is where the view starts (its rate's span).
func (pl *Planner) view(now time.Time) (reqs []Request, from time.Time, why string) {
	from = now.Add(-pl.cfg.Window)
	if pl.mixFrom.After(from) {
		from = pl.mixFrom
		why = pl.mixWhy
	}
	recentFrom := now.Add(-pl.cfg.Window / shiftShare)
	var older, recent []Request
	for _, r := range pl.reqs {
		switch {
		case r.At.Before(from):
		case r.At.Before(recentFrom):
			older = append(older, r)
		default:
			recent = append(recent, r)
		}
	}
	reqs = append(older, recent...)
	if why == "" && len(reqs) > 0 {
		from = reqs[0].At
	}
	if len(older) < minShiftSample || len(recent) < shiftSample(pl.cfg) {
		return reqs, from, why
	}
	for _, c := range []struct {
		what string
		of   func(Request) float64
	}{
		{"uncached prompt lengths", func(r Request) float64 { return float64(r.UncachedTokens) }},
		{"output lengths", func(r Request) float64 { return float64(r.OutputTokens) }},
	} {
		d := ksDistance(values(older, c.of), values(recent, c.of))
		n, m := float64(len(older)), float64(len(recent))
		if crit := shiftCritical * math.Sqrt((n+m)/(n*m)); d > crit {
			pl.mixFrom = recentFrom
			pl.mixWhy = fmt.Sprintf("the %s changed at %s (KS distance %.2f > %.2f between the %v before and the %v after): fitted on the requests since",
				c.what, recentFrom.UTC().Format("15:04:05.000"), d, crit, recentFrom.Sub(reqs[0].At).Round(time.Millisecond), pl.cfg.Window/shiftShare)
			return recent, recentFrom, pl.mixWhy
		}
	}
	return reqs, from, why
}

// shiftSample is the fewest requests of a new mix a shift is judged on,
// and a decision made from once it is seen (Config.MinRequests for the
// whole window).
func shiftSample(c Config) int { return max(minShiftSample, c.MinRequests/2) }

func values(rs []Request, of func(Request) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = of(r)
	}
	slices.Sort(out)
	return out
}

// ksDistance is the two-sample Kolmogorov–Smirnov statistic of a and b,
// both ascending: the largest gap between their empirical distributions.
func ksDistance(a, b []float64) float64 {
	var i, j int
	var d float64
	for i < len(a) && j < len(b) {
		x := min(a[i], b[j])
		for i < len(a) && a[i] == x {
			i++
		}
		for j < len(b) && b[j] == x {
			j++
		}
		d = max(d, math.Abs(float64(i)/float64(len(a))-float64(j)/float64(len(b))))
	}
	return d
}
