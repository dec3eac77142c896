package experiment

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/tandem-serve/tandem/internal/bench"
)

// tuneAll tunes the colocated engines' settings the configurations need:
// the chunk budget when a colocated configuration runs and MNBTs has more
// than one value (else its last value), then, at that budget,
// colocated-cadence's prefill cadence when Intervals has more than one
// value (else its only value).
func (r *pdRun) tuneAll(ctx context.Context, w io.Writer) (tuned, error) {
	cfg := r.cfg
	t := tuned{mnbt: cfg.MNBTs[len(cfg.MNBTs)-1], interval: 1}
	if len(cfg.Intervals) > 0 {
		t.interval = cfg.Intervals[len(cfg.Intervals)-1]
	}
	plain, cadence := slices.Contains(cfg.Configs, "colocated"), slices.Contains(cfg.Configs, "colocated-cadence")
	var err error
	if len(cfg.MNBTs) > 1 && (plain || cadence) {
		t.mnbt, err = r.tune(ctx, w, "--max-num-batched-tokens", "mnbt", "", cfg.MNBTs, func(v int) (string, error) {
			return r.startColocated(ctx, r.model, v, 0)
		})
		if err != nil {
			return t, err
		}
	}
	if len(cfg.Intervals) > 1 && cadence {
		t.interval, err = r.tune(ctx, w, "--prefill-schedule-interval", "interval", fmt.Sprintf(" at --max-num-batched-tokens %d", t.mnbt), cfg.Intervals, func(v int) (string, error) {
			return r.startColocated(ctx, r.model, t.mnbt, v)
		})
	}
	return t, err
}

// tune runs the long workload at its middle rate against a colocated engine
// started by start with each of values for flag (short names the tuning
// runs; at, when set, says what the engine keeps fixed) and keeps the one with the highest SLO
// attainment, then (on a tie, which a few requests make likely) the larger
// area under the attainment curve over the SLO scales — the margin left on
// both TTFT and TPOT — then the lower ITL p99: a 2048-token chunk is a
// second-long step on a small CPU, and comparing P/D against that would be
// a straw man. Goodput in requests/s is not a criterion: at equal
// attainment it differs by the noise in the level's duration. The
// chunk budget and the prefill cadence are tuned this way.
func (r *pdRun) tune(ctx context.Context, w io.Writer, flag, short, at string, values []int, start func(v int) (string, error)) (int, error) {
	x, cfg := r.experiment, r.cfg
	wl := cfg.Workloads[len(cfg.Workloads)-1]
	for _, c := range cfg.Workloads {
		if c.Name == "long" {
			wl = c
		}
	}
	rate := wl.Rates[len(wl.Rates)/2]
	fmt.Fprintf(w, "== tuning the colocated engine's %s%s on the %s workload at %g req/s, %d requests ==\n", flag, at, wl.Name, rate, cfg.TuneRequests)
	type score struct{ attained, curve, itl float64 }
	better := func(a, b score) bool {
		if a.attained != b.attained {
			return a.attained > b.attained
		}
		if math.Abs(a.curve-b.curve) > 1e-9 {
			return a.curve > b.curve
		}
		return a.itl < b.itl
	}
	best, bestScore := 0, score{-1, -1, math.Inf(1)}
	for _, v := range values {
		url, err := start(v)
		if err != nil {
			return 0, err
		}
		s, err := x.runWorkload(ctx, []bench.Target{{Name: fmt.Sprintf("colocated-%s%d", short, v), URL: url}}, wl, loadsOf([]float64{rate}), 1, cfg.TuneRequests)
		x.stopAll()
		if err != nil {
			return 0, err
		}
		x.noteFailures(s, "tuning")
		res := s.Results[0]
		sc := score{attained: res.Attained, itl: res.ITL.P99}
		for _, c := range res.Curve {
			sc.curve += c.Attainment
		}
		fmt.Fprintf(w, "  %s %5d: SLO met %3.0f%% (summed over the SLO scales %.2f), goodput %.2f req/s, TTFT p90 %.0f ms, TPOT p99 %.1f ms, ITL p50 %.0f ms, ITL p99 %.0f ms\n",
			flag, v, 100*res.Attained, sc.curve, res.Goodput, res.TTFT.P90, res.TPOT.P99, res.ITL.P50, res.ITL.P99)
		if better(sc, bestScore) {
			best, bestScore = v, sc
		}
	}
	fmt.Fprintf(w, "  chosen: %d\n\n", best)
	return best, nil
}
