package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestNoCrossingWithoutAValley is the ratio check's case at N = 16 (the
// long mix, 1,024–2,048-token prompts at 9.5 req/s, a flat decode step):
// the split runs 8P:8D with the threshold at 256 and the model's best is
// 11P:5D, every split between predicted more than 8P:8D at its own best
// threshold, so there is no valley to cross. The split steps one engine
// toward the best. Before, the step was valued at the threshold it would
// run with, held at 256 by the threshold's hysteresis (within 10% of its
// best), and that dip below the current split's value at its own best
// threshold was taken for a valley: the split went straight from 8P:8D to
// 11P:5D, on the engines from 9P:7D to 13P:3D in one decision. (Since a
// decode's capacity counts its streams' spread and the step's growth past
// the batches seen, this window's best is 10P:6D, the measured best, and
// 8P:8D is within the hysteresis of it: the case starts from 7P:9D.)
func TestNoCrossingWithoutAValley(t *testing.T) {
	const n, p0 = 16, 7
	pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: n, Prefill: p0,
		Window: time.Minute, MinDwell: 10 * time.Second})
	rng := rand.New(rand.NewPCG(0, 9))
	end := t0.Add(12 * time.Second)
	for at := t0; at.Before(end); at = at.Add(time.Duration(rng.ExpFloat64() / 9.5 * float64(time.Second))) {
		l := 1024 + rng.IntN(1025)
		pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 100 + rng.IntN(201)})
		pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: 0.0004 * float64(l) * (1 + 0.05*rng.Float64())})
	}
	for i := range 12 {
		for e := range n {
			s := EngineSample{At: t0.Add(time.Duration(i+1) * time.Second), URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.0004, TransferSecondsPerToken: 2e-6}
			if e >= p0 {
				k := 1 + float64(rng.IntN(4))
				s.Decode, s.Running, s.ITLSeconds = true, k, (1.7+7.1*math.Pow(k, 0.3)+rng.Float64())/1000
			}
			pl.ObserveEngine(s)
		}
	}
	d := pl.Decide(end)
	if d.Best.P <= p0+1 {
		t.Fatalf("best %dP:%dD, want one more than a step above %dP (the case needs a best two or more engines away)", d.Best.P, d.Best.D, p0)
	}
	for _, s := range d.Splits {
		if s.P > p0 && s.P < d.Best.P && s.Goodput < d.Fit.Current.Goodput {
			t.Fatalf("%dP:%dD predicts %.2f req/s, less than %.2f now: the case needs no valley", s.P, s.D, s.Goodput, d.Fit.Current.Goodput)
		}
	}
	if d.Crossed || d.Prefill != p0+1 {
		t.Fatalf("%dP → %dP (crossed %v) with the best at %dP and no valley between (splits %v): want one step, to %dP",
			p0, d.Prefill, d.Crossed, d.Best.P, d.Splits, p0+1)
	}
}
