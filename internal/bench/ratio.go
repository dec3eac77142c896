package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

// SplitGoodput is the goodput (requests/s) the model predicts for p
// prefill and d decode engines: min(p·prefill rate at p, d·decode rate).
func (m *PDModel) SplitGoodput(p, d int) float64 {
	return math.Min(float64(p)*m.PrefillRateAt(p), float64(d)*m.DecodeRate)
}

// SplitLimit is the side that limits p prefill and d decode engines in
// the model: "prefill" when p·prefill rate at p < d·decode rate, else
// "decode".
func (m *PDModel) SplitLimit(p, d int) string {
	if float64(p)*m.PrefillRateAt(p) < float64(d)*m.DecodeRate {
		return "prefill"
	}
	return "decode"
}

// SplitsToMeasure are the prefill counts P (of n engines, D = n − P) a
// check of the model measures: the predicted best P and neighbours on
// either side of it and, with far, splits far from it — n/2 and the quarter
// on the other side of the prediction (n/4 when it asks for more prefill
// than decode, 3n/4 when fewer; both when it asks for n/2) — so that a
// prediction off by more than its neighbours still shows. Sorted, distinct,
// in [1, n−1]; nil for n < 2.
func SplitsToMeasure(bestP, n, neighbours int, far bool) []int {
	if n < 2 {
		return nil
	}
	ps := []int{bestP}
	for i := 1; i <= neighbours; i++ {
		ps = append(ps, bestP-i, bestP+i)
	}
	if far {
		ps = append(ps, n/2)
		switch half := n / 2; {
		case bestP > half:
			ps = append(ps, n/4)
		case bestP < half:
			ps = append(ps, n-n/4)
		default:
			ps = append(ps, n/4, n-n/4)
		}
	}
	var out []int
	for _, p := range ps {
		if p >= 1 && p <= n-1 {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// RatioPoint is one P:D split of a RatioCheck: what the model predicts for
// it and what a rate search measured.
type RatioPoint struct {
	P int `json:"p"`
	D int `json:"d"`
	// Predicted is the model's goodput for this split (SplitGoodput), and
	// Limit the side the model says limits it: "prefill" (TTFT misses
	// should dominate past it) or "decode" (TPOT misses).
	Predicted float64 `json:"predicted_rps"`
	Limit     string  `json:"predicted_limit,omitempty"`
	// Measured is the highest rate tried at which Goal of the requests
	// met both SLOs (SearchResult.MaxRate, 0 if none did); FirstMiss the
	// lowest rate that missed (0 if none did): the true goodput rate lies
	// in [Measured, FirstMiss).
	Measured  float64 `json:"measured_rps"`
	FirstMiss float64 `json:"first_miss_rps,omitempty"`
	// Bound is how Measured bounds the goodput rate
	// (SearchResult.Bound).
	Bound  Bound         `json:"bound"`
	Points []SearchPoint `json:"points"`
	// Misses splits the requests of the first rate that missed by why:
	// the SLO each missed, or failure.
	Misses MissCauses `json:"misses_at_first_miss"`
	// Host is what the host did while the search's levels ran (filled by
	// the caller; free text such as "proxy 0.42 core peak, host 71% busy
	// peak, load 3.1 peak").
	Host string `json:"host,omitempty"`
	// HostBound says that the host (its cores or the proxy) was near
	// saturation at the rate that bounded the search, so the measurement
	// may show the host's limit rather than the engines'.
	HostBound bool `json:"host_bound,omitempty"`
}

// MissCauses counts the requests of one level by how they missed the SLO.
// A request that misses both TTFT and TPOT counts in both.
type MissCauses struct {
	Requests int `json:"requests"`
	TTFT     int `json:"ttft"`
	TPOT     int `json:"tpot"`
	Failed   int `json:"failed"`
}

// CountMisses counts r's requests that missed slo's TTFT or TPOT, or
// failed.
func CountMisses(r *Result, slo SLO) MissCauses {
	var c MissCauses
	if r == nil {
		return c
	}
	c.Requests = len(r.Records)
	for i := range r.Records {
		rec := &r.Records[i]
		switch {
		case rec.Err != "":
			c.Failed++
			continue
		case slo.TTFT > 0 && rec.TTFT > slo.TTFT:
			c.TTFT++
		}
		if slo.TPOT > 0 && rec.tpot() > slo.TPOT {
			c.TPOT++
		}
	}
	return c
}

// String is e.g. "of 40: 9 TTFT, 2 TPOT, 0 failed".
func (c MissCauses) String() string {
	if c.Requests == 0 {
		return "-"
	}
	return fmt.Sprintf("of %d: %d TTFT, %d TPOT, %d failed", c.Requests, c.TTFT, c.TPOT, c.Failed)
}

// RatioCheck compares a PDModel's prediction for N engines with rate
// searches on several P:D splits of them.
type RatioCheck struct {
	Workload string `json:"workload"`
	N        int    `json:"n"`
	// Predicted is the model's best split and its goodput; Curve the
	// model's goodput at every split, P = 1 … N−1.
	Predicted Split        `json:"predicted"`
	Curve     []Split      `json:"model_curve"`
	Splits    []RatioPoint `json:"splits"`
	// Best is the measured split with the highest goodput rate (the
	// smaller P on a tie); PredictedMeasured the predicted split's
	// measured goodput rate (0 if it was not measured).
	Best              RatioPoint `json:"measured_best"`
	PredictedMeasured float64    `json:"predicted_split_measured_rps"`
	// GoodputError is (measured − predicted)/predicted of the predicted
	// split's goodput; BestError the same of the measured best split
	// against the predicted best goodput.
	GoodputError float64 `json:"goodput_error"`
	BestError    float64 `json:"best_goodput_error"`
	// Regret is the goodput lost by running the predicted split instead
	// of the measured best: 1 − PredictedMeasured/Best.Measured.
	Regret float64 `json:"regret"`
	// Verdict is "right" (the measured best is the predicted split),
	// "tie" (the predicted split's search bracket overlaps the best's: the
	// searches cannot tell them apart), "wrong", "none met" (no split met
	// the goal at any rate tried: nothing to compare) or "not measured"
	// (the predicted split was not).
	Verdict string `json:"verdict"`
}

// NewRatioCheck is the comparison of m's prediction for n engines with
// the measured splits.
func NewRatioCheck(m *PDModel, n int, splits []RatioPoint) RatioCheck {
	c := RatioCheck{Workload: m.Workload, N: n, Predicted: m.BestSplit(n), Splits: slices.Clone(splits)}
	slices.SortFunc(c.Splits, func(a, b RatioPoint) int { return a.P - b.P })
	for i := range c.Splits {
		c.Splits[i].Limit = m.SplitLimit(c.Splits[i].P, c.Splits[i].D)
	}
	for p := 1; p < n; p++ {
		c.Curve = append(c.Curve, Split{N: n, P: p, D: n - p, Goodput: m.SplitGoodput(p, n-p)})
	}
	if len(c.Splits) == 0 {
		c.Verdict = "not measured"
		return c
	}
	bi := 0
	for i, s := range c.Splits {
		if s.Measured > c.Splits[bi].Measured {
			bi = i
		}
	}
	c.Best = c.Splits[bi]
	pi := slices.IndexFunc(c.Splits, func(s RatioPoint) bool { return s.P == c.Predicted.P })
	if c.Predicted.Goodput > 0 {
		c.BestError = c.Best.Measured/c.Predicted.Goodput - 1
	}
	if pi < 0 {
		c.Verdict = "not measured"
		return c
	}
	ps := c.Splits[pi]
	c.PredictedMeasured = ps.Measured
	if c.Predicted.Goodput > 0 {
		c.GoodputError = ps.Measured/c.Predicted.Goodput - 1
	}
	if c.Best.Measured > 0 {
		c.Regret = 1 - ps.Measured/c.Best.Measured
	}
	switch {
	case c.Best.Measured == 0:
		c.Verdict = "none met"
	case pi == bi || ps.Measured >= c.Best.Measured:
		c.Verdict = "right"
	case ps.FirstMiss == 0 || ps.FirstMiss > c.Best.Measured:
		// The predicted split's goodput lies in [Measured, FirstMiss),
		// which reaches the best's lower bound.
		c.Verdict = "tie"
	default:
		c.Verdict = "wrong"
	}
	return c
}

// WriteRatioChecks writes the checks as a table per workload: every split
// measured, the prediction marked, then a line per N with the verdict.
// scale converts the rates for printing (1 for none; 1/speed for a
// simulation run at speed, to the simulated hardware's requests/s).
func WriteRatioChecks(w io.Writer, checks []RatioCheck, scale float64) {
	r := func(x float64) string { return fmt.Sprintf("%.3g", x*scale) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  workload\tN\tsplit\tpredicted req/s (limit)\tmeasured goodput rate\tmisses at the first rate missed\thost at the rate that bounded the search")
	for _, c := range checks {
		for _, s := range c.Splits {
			mark := ""
			if s.P == c.Predicted.P {
				mark += " ◀ predicted"
			}
			if s.P == c.Best.P && s.Measured > 0 {
				mark += " ★ measured best"
			}
			var meas string
			switch s.Bound {
			case BoundBelow:
				meas = "< " + r(s.FirstMiss)
			case BoundAtLeast:
				meas = "≥ " + r(s.Measured)
			default:
				meas = fmt.Sprintf("%s (%s missed)", r(s.Measured), r(s.FirstMiss))
			}
			if s.HostBound {
				meas += " HOST-BOUND"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%dP:%dD%s\t%s (%s)\t%s\t%s\t%s\n", c.Workload, c.N, s.P, s.D, mark, r(s.Predicted), s.Limit, meas, s.Misses, s.Host)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, c := range checks {
		fmt.Fprintf(w, "  %s N=%d: predicted %dP:%dD at %s req/s; measured best %dP:%dD at %s req/s; the predicted split measured %s req/s (error %+.0f%%, best's %+.0f%%); %s\n",
			c.Workload, c.N, c.Predicted.P, c.Predicted.D, r(c.Predicted.Goodput), c.Best.P, c.Best.D, r(c.Best.Measured), r(c.PredictedMeasured),
			100*c.GoodputError, 100*c.BestError, c.VerdictText())
	}
}

// VerdictText says the verdict in words.
func (c RatioCheck) VerdictText() string {
	switch c.Verdict {
	case "right":
		return "the prediction is RIGHT: no measured split did better"
	case "tie":
		return fmt.Sprintf("a TIE: %dP:%dD measured higher, but within the rate search's resolution of the predicted split (%.0f%% lower at most)",
			c.Best.P, c.Best.D, 100*c.Regret)
	case "wrong":
		return fmt.Sprintf("the prediction is WRONG: %dP:%dD does better, the predicted split gives up %.0f%% of its goodput", c.Best.P, c.Best.D, 100*c.Regret)
	case "none met":
		return "NOTHING TO COMPARE: no split met the goal at any rate tried"
	}
	return "the predicted split was not measured"
}
