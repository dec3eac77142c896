package planner

import (
	"time"
)

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
