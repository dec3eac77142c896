package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// thresholds are the conditional thresholds a decision weighs, with the
// model of each (fitted once per decision and shared by the split's and
// the threshold's choice).
type thresholds struct {
	pl *Planner
	f  Fit
	// limit is the longest uncached prompt a decode may prefill itself: one
	// whose prefill fits the TTFT objective alone and does not by itself
	// push more than 1 − q of the streams it stalls past the TPOT
	// objective (stalls.longest: the streams' own slack, the short answers'
	// as well as the long ones', not the mean stream's).
	limit int
	// cands are the thresholds that split the window's prompts differently
	// (every distinct uncached length + 1, and MinThreshold), at most
	// maxThresholds of them.
	cands  []int
	models map[int]*capacity
}

// thresholds are the candidate thresholds of the fit f.
func (pl *Planner) thresholds(f Fit) *thresholds {
	t := &thresholds{pl: pl, f: f, limit: pl.cfg.MaxThreshold, models: map[int]*capacity{}}
	if cv := f.prefill(); cv.B > 0 || cv.C > 0 {
		t.limit = min(t.limit, cv.Tokens(pl.cfg.TTFT.Seconds()-f.Overhead))
		chunk := cv.Seconds(float64(max(f.MaxBatchedTokens, 1)))
		st := newStalls(nil, pl.win, chunk)
		if l := st.longest(f.stepSeconds(), pl.cfg.TPOT.Seconds(), 1-math.Sqrt(pl.cfg.Goal)); !math.IsInf(l, 1) {
			t.limit = min(t.limit, cv.Tokens(l))
		}
	}
	cands := []int{pl.cfg.MinThreshold}
	for _, r := range sample(pl.win, maxModelRequests) {
		if l := r.UncachedTokens + 1; l > pl.cfg.MinThreshold && l <= t.limit {
			cands = append(cands, l)
		}
	}
	slices.Sort(cands)
	cands = slices.Compact(cands)
	if len(cands) > maxThresholds {
		// Keep quantiles (each candidate costs a fit), the lowest and the
		// highest among them: the highest keeps every prompt of the window
		// local.
		step := float64(len(cands)-1) / (maxThresholds - 1)
		var kept []int
		for i := range maxThresholds {
			kept = append(kept, cands[int(math.Round(float64(i)*step))])
		}
		cands = kept
	}
	t.cands = cands
	return t
}

// model is the capacity model at threshold th.
func (t *thresholds) model(th int) *capacity {
	m, ok := t.models[th]
	if !ok {
		m = t.pl.model(t.f, th)
		t.models[th] = m
	}
	return m
}

// broken says the threshold th keeps prompts local that break the limits:
// a hard constraint, not a matter of goodput (and the decodes' step times,
// measured with those stalls in them, may make every choice look
// unattainable).
func (t *thresholds) broken(th int) bool {
	return th > max(t.limit+1, t.pl.cfg.MinThreshold)
}

// best is the split with a prefill pool and the threshold that together
// predict the most goodput (the fewest prefill engines, then the lowest
// threshold, on a tie), with that threshold's model: where the split is
// headed. The current threshold is weighed with the candidates unless it
// is broken.
func (t *thresholds) best(bounds Config) (int, *capacity, Split) {
	cands := t.cands
	if th := t.pl.threshold; !t.broken(th) && !slices.Contains(cands, th) {
		cands = append(slices.Clone(cands), th)
		slices.Sort(cands)
	}
	bestTh, bestS := 0, Split{Goodput: -1}
	for _, th := range cands {
		if s := t.model(th).best(bounds); s.Goodput > bestS.Goodput || s.Goodput == bestS.Goodput && s.P < bestS.P {
			bestTh, bestS = th, s
		}
	}
	return bestTh, t.model(bestTh), bestS
}

// forSplit is the threshold to run at p prefill and d decode engines (p >
// 0), with its model, and why the current one is kept where another
// predicts more ("" when it is the best). The threshold is chosen for the
// split that runs, not for the best split the split is headed to: a
// threshold that suits three prefill engines sends one too many prompts.
// It changes only when its predicted goodput at that split beats the
// current threshold's by Config.Hysteresis and, at the split of its last
// change, Config.StepDwell has passed since (Config.MinDwell when it turns
// back: a lower threshold after a higher one, or the reverse); at another
// split it is chosen anew, and a broken current threshold changes at once.
func (t *thresholds) forSplit(p, d int, now time.Time) (int, *capacity, string) {
	pl := t.pl
	cur := pl.threshold
	curG := t.model(cur).split(p, d).Goodput
	broken := t.broken(cur)
	bestTh, bestG := cur, curG
	if broken {
		bestG = -1
	}
	for _, th := range t.cands {
		if g := t.model(th).split(p, d).Goodput; g > bestG {
			bestTh, bestG = th, g
		}
	}
	switch {
	case bestTh == cur || broken:
		return bestTh, t.model(bestTh), ""
	case bestG < curG*(1+pl.cfg.Hysteresis):
		return cur, t.model(cur), fmt.Sprintf("threshold hysteresis: %d tokens is predicted %.2f req/s at %dP:%dD against %.2f for %d, less than %.0f%% more",
			bestTh, bestG, p, d, curG, cur, 100*pl.cfg.Hysteresis)
	case p == pl.thSplit && now.Sub(pl.thChange) < pl.thresholdDwell(bestTh):
		return cur, t.model(cur), fmt.Sprintf("threshold dwell: it changed %v ago at this split, less than %v",
			now.Sub(pl.thChange).Round(100*time.Millisecond), pl.thresholdDwell(bestTh))
	}
	return bestTh, t.model(bestTh), ""
}

// thresholdDwell is the least time since the threshold's last change, at
// the same split, before it changes to th: Config.StepDwell when that goes
// on in the last change's direction, Config.MinDwell when it turns back.
func (pl *Planner) thresholdDwell(th int) time.Duration {
	if cmp.Compare(th, pl.threshold) == pl.thDir {
		return pl.cfg.StepDwell
	}
	return pl.cfg.MinDwell
}

// setThreshold makes th the threshold from now, chosen at p prefill
// engines.
func (pl *Planner) setThreshold(th, p int, now time.Time) {
	if th == pl.threshold {
		return
	}
	pl.thDir, pl.thSplit, pl.thChange = cmp.Compare(th, pl.threshold), p, now
	pl.threshold = th
}
