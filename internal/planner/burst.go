package planner

import (
	"slices"
	"time"
)

// dispersionWindows is how many windows (Config.Window) of arrivals the
// index of dispersion is measured over. One window may hold a burst whole
// or fall within one: the P/D experiment's window is one level (3 s, a
// round or two of 60 requests), and measured over it alone the dispersion
// swung between 1 and 15 from one decision to the next, the colocated
// split's predicted goodput with it, and the split followed (11–13
// changes a run). Burstiness is the arrival process's, seen over several
// of its bursts.
const dispersionWindows = 4

// burstyDispersion is the index of dispersion from which the arrivals are
// taken as bursts whose size bounds the decodes' batches (Fit.BurstRequests).
// A Poisson stream's, measured over dispersionWindows windows (48 bins of
// the P/D experiment's 3-s window and 250-ms TTFT objective, its standard
// error about 0.2), passes it about once in a hundred decisions, and a
// burst is counted only where the arrivals also show a gap of a stream's
// life; sparse Poisson arrivals have such gaps, but their "bursts" would
// merge at the higher rates the model weighs, where a burst of fixed size
// (the P/D experiment's rounds) would not. The experiment's 20 req/s level
// (60 requests over 3 s, then the drain) measures 1.5–2.3 over the
// history it shares with the 10 req/s one: at 2 the model took half its
// decisions there as sustained traffic, the two decodes of 2P:2D past
// their seats.
const burstyDispersion = 1.5

// minDispersionBins is the fewest bins the arrivals' index of dispersion
// is measured over; with fewer it is taken as a Poisson stream's, 1.
const minDispersionBins = 4

// arrivalDispersion is the index of dispersion of the requests' arrival
// counts (their variance over their mean) in bins of width bin from from
// to now (whole bins, the last ending at now): 1 for Poisson arrivals, below 1 for evenly paced ones, and
// above for bursts (a level's requests sent in a second or two, then
// none): about 1 + (1 − f)·λ·bin for bursts at rate λ a fraction f of the
// time. It is what the queueing terms take as the arrivals' squared
// coefficient of variation (for a renewal stream the two agree as the
// bins grow; bursts are correlated arrivals that inter-arrival times
// alone would not show). Bins of the TTFT objective's width see the
// bursts a queue must clear within it. 1 when the span holds fewer than
// minDispersionBins bins or no request.
func arrivalDispersion(reqs []Request, from, now time.Time, bin time.Duration) float64 {
	span := now.Sub(from)
	if bin <= 0 || span < minDispersionBins*bin || len(reqs) == 0 {
		return 1
	}
	counts := make([]float64, int(span/bin))
	start := now.Add(-time.Duration(len(counts)) * bin)
	for _, r := range reqs {
		if r.At.Before(start) || r.At.After(now) {
			continue
		}
		counts[min(int(r.At.Sub(start)/bin), len(counts)-1)]++
	}
	m := Mean(counts)
	if m <= 0 {
		return 1
	}
	sd := StdDev(counts)
	return sd * sd / m
}

// largestBurst is the most requests of one burst among reqs: arrivals
// that each came while a request before them was still being answered. A
// burst ends where every request before a gap had finished: each at its
// answer's end where the planner was told it (ObserveOutput), else life
// after it arrived (a stream's life: requests then arrive further apart
// than that). It is 0 when no burst ended, between two arrivals or before
// now: the window then shows no gap, and the traffic is taken as
// sustained. A burst cut by the window's start counts what the window
// holds of it. Bursts that the engines drain before the next (the P/D
// experiment's rounds, each run to its last answer) are told apart
// however their answers' lengths fall; by arrival gaps alone, rounds whose
// last answers were short merged (two or three rounds of 16 seen as one
// burst of 32–48, their streams priced as stalled by twice the prompts).
func largestBurst(reqs []Request, now time.Time, life time.Duration) int {
	if len(reqs) == 0 || life <= 0 {
		return 0
	}
	rs := slices.Clone(reqs)
	slices.SortFunc(rs, func(a, b Request) int { return a.At.Compare(b.At) })
	end := func(r Request) time.Time {
		if !r.done.IsZero() {
			return r.done
		}
		return r.At.Add(life)
	}
	most, n, gaps := 0, 0, 0
	var busy time.Time // when every request of the burst so far has ended
	for i, r := range rs {
		if i > 0 && r.At.After(busy) {
			most, n = max(most, n), 0
			gaps++
		}
		n++
		if e := end(r); e.After(busy) {
			busy = e
		}
	}
	if now.After(busy) {
		gaps++
	}
	if gaps == 0 {
		return 0
	}
	return max(most, n)
}
