package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// longStart feeds pl the first window of the P/D experiment's long mix
// from the colocated start (1,024–2,048-token prompts, every one local,
// at 2 req/s for 10 s) with its four decodes scraped every second at the
// batches bs in turn, their step 2.2 + 1.7·k^0.8 ms (the curve the first
// window fitted), and returns the window's end.
func longStart(pl *Planner, bs []float64) time.Time {
	rng := rand.New(rand.NewPCG(2, 26))
	end := t0.Add(10 * time.Second)
	for at := t0; at.Before(end); at = at.Add(time.Duration(rng.ExpFloat64() / 2 * float64(time.Second))) {
		l := 1024 + rng.IntN(1025)
		pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 100 + rng.IntN(201)})
		pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: 0.0004 * float64(l) * (1 + 0.05*rng.Float64()), Local: true})
	}
	for i := range 10 {
		for e := range 4 {
			k := bs[(i+e)%len(bs)]
			pl.ObserveEngine(EngineSample{At: t0.Add(time.Duration(i+1) * time.Second), URL: fmt.Sprint("e", e), Decode: true,
				PrefillSecondsPerToken: 0.0004, TransferSecondsPerToken: 2e-6, Running: k,
				ITLSeconds: (2.2 + 1.7*math.Pow(k, 0.8) + 0.5*rng.Float64()) / 1000})
		}
	}
	return end
}

// TestNoMoveOnAnUnmeasuredBatch: from the colocated start, with the decode
// step measured at batches 0.5–2 only, the model ranks a split with a
// prefill pool first, its decodes at several times the measured batch;
// the split holds and says why. Measured up to the batches that split
// runs at (the model's lead is then 9%: the hysteresis set under it), it
// moves.
func TestNoMoveOnAnUnmeasuredBatch(t *testing.T) {
	cfg := Config{TTFT: 2500 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Window: 15 * time.Second, MinDwell: 7500 * time.Millisecond}
	pl := newPlanner(t, cfg)
	d := pl.Decide(longStart(pl, []float64{0.5, 1, 1.5, 2}))
	if d.Best.P == 0 {
		t.Fatalf("best %dP:%dD (splits %v): the case needs the model to rank a prefill pool first", d.Best.P, d.Best.D, d.Splits)
	}
	if d.Changed || !strings.HasPrefix(d.Held, "unmeasured batch") {
		t.Fatalf("0P:4D → %dP:%dD (held %q, splits %v, batches measured %.1f–%.1f): want it held on the unmeasured batch",
			d.Prefill, d.Decode, d.Held, d.Splits, d.Fit.StepBatchMin, d.Fit.StepBatchMax)
	}
	cfg.Hysteresis = 0.05
	pl = newPlanner(t, cfg)
	d = pl.Decide(longStart(pl, []float64{0.5, 1, 2, 4, 8, 16, 24}))
	if !d.Changed || strings.HasPrefix(d.Held, "unmeasured batch") {
		t.Fatalf("held at 0P:4D (%q, best %dP:%dD, splits %v, batches measured %.1f–%.1f): want the move once the batches are measured",
			d.Held, d.Best.P, d.Best.D, d.Splits, d.Fit.StepBatchMin, d.Fit.StepBatchMax)
	}
}
