package planner

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// mixed feeds pl dur of a mix of 64-, 400- and 1000-token prompts (8, 4
// and 4 req/s) and the fake engines' scrapes, the first p in the prefill
// pool.
func mixed(pl *Planner, start time.Time, dur time.Duration, n, p int) time.Time {
	end := feed(pl, start, dur, traffic{prompt: 64, output: 64, rate: 8}, n, p)
	for at := start; at.Before(end); at = at.Add(250 * time.Millisecond) {
		pl.ObserveRequest(Request{At: at, PromptTokens: 1000, UncachedTokens: 1000, OutputTokens: 64})
		pl.ObserveRequest(Request{At: at, PromptTokens: 400, UncachedTokens: 400, OutputTokens: 64})
	}
	return end
}

// TestThresholdFitsTheSplitThatRuns: the best split is three prefill
// engines with every prompt remote (threshold 16), but the split moves one
// engine at a time, from one prefill engine to two. At two, threshold 16
// sends both engines every prompt and predicts a third less than keeping
// the short prompts local: the threshold is chosen for the split that runs
// after the decision, not for the one the split is headed to.
func TestThresholdFitsTheSplitThatRuns(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond, Engines: 8, Prefill: 1, MinPrefill: 1})
	now := mixed(pl, t0, 20*time.Second, 8, 1)
	d := pl.Decide(now)
	if !d.Changed || d.Prefill != 2 || d.Best.P != 3 {
		t.Fatalf("got %dP:%dD (changed %v, best %+v), want a step from 1P toward 3P", d.Prefill, d.Decode, d.Changed, d.Best)
	}
	chosen := pl.model(d.Fit, d.Threshold).split(d.Prefill, d.Decode).Goodput
	for _, th := range []int{16, 65, 401, 1001} {
		if g := pl.model(d.Fit, th).split(d.Prefill, d.Decode).Goodput; g > chosen*(1+pl.cfg.Hysteresis) {
			t.Errorf("at %dP:%dD threshold %d predicts %.2f req/s, more than the chosen %d's %.2f", d.Prefill, d.Decode, th, g, d.Threshold, chosen)
		}
	}
}

// TestSteadyMixDoesNotSwingTheThreshold: a steady chat-like mix (lognormal
// prompts, a short window as in the P/D experiment's, so that each decision
// sees a noisy sample) at a split with a prefill pool. The threshold may
// follow the split (which this noise moves between 1P:3D and 2P:2D), but
// at one split it does not turn back within the dwell, and it changes
// seldom (the planner without a dwell of its own for the threshold changed
// it 51 times, 28 of them turning back within the dwell).
func TestSteadyMixDoesNotSwingTheThreshold(t *testing.T) {
	const n = 4
	dwell := 6 * time.Second
	pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: n, Prefill: 2, MinPrefill: 1,
		MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: dwell})
	rng := rand.New(rand.NewPCG(3, 4))
	logn := func(med, sigma float64, hi int) int {
		return min(max(int(med*math.Exp(sigma*rng.NormFloat64())), 4), hi)
	}
	at, tick := t0, 800*time.Millisecond
	var changes, turns, lastDir int
	var last time.Time
	const decisions = 150
	for i := range decisions {
		end := t0.Add(time.Duration(i+1) * tick)
		for at.Before(end) {
			l := logn(128, 1, 1024)
			pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: logn(160, 0.9, 512)})
			at = at.Add(time.Duration(rng.ExpFloat64() / 20 * float64(time.Second)))
		}
		p := pl.prefill
		for e := range n {
			s := EngineSample{At: end, URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.00015 * (1 + 0.1*rng.Float64()), TransferSecondsPerToken: 2e-6}
			if e >= p {
				k := float64(2 + 4*((e+i)%4))
				s.Decode, s.Running, s.ITLSeconds = true, k, (1.5+0.5*k+0.5*rng.Float64())/1000
			}
			pl.ObserveEngine(s)
		}
		before := pl.threshold
		d := pl.Decide(end)
		if d.Threshold == before {
			continue
		}
		changes++
		dir := cmp.Compare(d.Threshold, before)
		// A threshold that breaks the hard limits (thresholds.broken)
		// changes at once, dwell or not.
		if dir == -lastDir && end.Sub(last) < dwell && d.Prefill == p && !pl.thresholds(d.Fit).broken(before) {
			turns++
			t.Logf("%v: threshold %d → %d at %dP:%dD, %v after the last change", end.Sub(t0), before, d.Threshold, d.Prefill, d.Decode, end.Sub(last))
		}
		lastDir, last = dir, end
	}
	if turns > 0 || changes > decisions/6 {
		t.Fatalf("a steady mix: the threshold changed %d times in %d decisions, %d of them turning back within the dwell", changes, decisions, turns)
	}
}
