package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// simStep is the simulated engine's decode step at contexts near 2,048
// tokens, wall clock at --sim-speed 4 (ms): 3.75 at batch 1, a jump to 12.5
// at 2, then a slow growth, 18.25 at 16, and on as the step's own work
// grows (×1.6 from 16 to 32, as the built-in profile does at context 512).
func simStep(k float64) float64 {
	switch {
	case k <= 1:
		return 3.75
	case k <= 2:
		return 3.75 + 8.75*(k-1)
	case k <= 16:
		return 12.5 + 5.75*math.Log2(k/2)/3
	}
	return 18.25 * (1 + 0.6*(k-16)/16)
}

// longMix feeds pl the ratio check's long mix (1,024–2,048-token prompts,
// 100–300-token answers, Poisson at rate) for dur from t0, the prefills
// measured at 0.4 ms a token, and a scrape of n engines a second, the
// first p prefilling, each decode at a batch drawn by batch and its step
// there (ms, with 4% noise). It returns the window's end.
func longMix(pl *Planner, seed uint64, rate float64, dur time.Duration, n, p int, batch func(*rand.Rand) float64, step func(*rand.Rand, float64) float64) time.Time {
	rng := rand.New(rand.NewPCG(seed, 26))
	end := t0.Add(dur)
	for at := t0; at.Before(end); at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))) {
		l := 1024 + rng.IntN(1025)
		pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 100 + rng.IntN(201)})
		pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: 0.0004 * float64(l) * (1 + 0.05*rng.Float64())})
	}
	for i := range int(dur / time.Second) {
		for e := range n {
			s := EngineSample{At: t0.Add(time.Duration(i+1) * time.Second), URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.0004, TransferSecondsPerToken: 2e-6}
			if e >= p {
				k := batch(rng)
				s.Decode, s.Running, s.ITLSeconds = true, k, step(rng, k)*(1+0.04*rng.NormFloat64())/1000
			}
			pl.ObserveEngine(s)
		}
	}
	return end
}

// scrapedSimStep is what a scrape of the simulated engine shows at batch
// k: the batch is a snapshot, the inter-token latency the scrape
// interval's mean, over batches about it.
func scrapedSimStep(rng *rand.Rand, k float64) float64 {
	var itl float64
	for range 4 {
		itl += simStep(max(k+float64(rng.IntN(3)-1), 1)) / 4
	}
	return itl
}

func splitsOf(d Decision) string {
	var s string
	for _, x := range d.Splits {
		s += fmt.Sprintf(" %dP %.1f", x.P, x.Goodput)
	}
	return s
}

// TestDecodeStarvedSplitsAreNotOverrated is the ratio check at N = 16 near
// saturation (10 req/s of the long mix, the decodes at batches 1–16,
// TPOT ≤ 25 ms): measured, 10P:6D and 12P:4D tie for the best and 13P:3D
// misses the TPOT objective. The concave fit over batches 1–16, dominated
// by the step's jump from 1 to 2, comes out flat (an exponent near 0.3); at
// the mean batch, with the flat curve past 16, a decode was worth twice
// what it carries, and 13P:3D was ranked first. With the step grown past
// the batches seen and the streams' spread counted, 13P:3D ranks below
// 12P:4D and the best is 10P–12P.
func TestDecodeStarvedSplitsAreNotOverrated(t *testing.T) {
	const n = 16
	pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: n, Prefill: 12,
		Window: time.Minute, MinDwell: 10 * time.Second})
	end := longMix(pl, 1, 10, 30*time.Second, n, 12, func(rng *rand.Rand) float64 { return float64(1 + rng.IntN(16)) }, scrapedSimStep)
	d := pl.Decide(end)
	if d.Fit.DecodeFit != "fit" {
		t.Fatalf("decode %s fit, want a fit over batches 1–16", d.Fit.DecodeFit)
	}
	by := map[int]float64{}
	for _, s := range d.Splits {
		by[s.P] = s.Goodput
	}
	if by[13] >= by[12] || d.Best.P < 10 || d.Best.P > 12 {
		t.Fatalf("best %dP:%dD; 13P:3D %.2f req/s against 12P:4D %.2f (splits%s), want 13P:3D below 12P:4D and the best 10P–12P",
			d.Best.P, d.Best.D, by[13], by[12], splitsOf(d))
	}
}

// TestLightLoadDoesNotDriftColocated is the ratio check at N = 16 and 5
// req/s, a third of the best: the decodes carry batches of 1–3, mostly 1,
// and their scrapes lie on the line the run fitted, 0.67 + 4.76·k ms (the
// simulated engine's jump from batch 1 to 2, smeared by scrape windows
// that hold both). Extrapolated, the line gave 77 ms at batch 16, a decode
// seemed worth 0.9 req/s, and the split drifted to colocated (0P:16D),
// which prefills the 1,024–2,048-token prompts beside the streams and was
// predicted 9.7 req/s against the 14 measured at 10P:6D. Grown past batch
// 3 as the prior's shape, the step keeps a prefill pool best, near the
// measured one. (With the line's points up to batch 4 it still drifts: the
// fit within the batches seen stands.)
func TestLightLoadDoesNotDriftColocated(t *testing.T) {
	const n = 16
	pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: n, Prefill: 8,
		Window: time.Minute, MinDwell: 10 * time.Second})
	end := longMix(pl, 2, 5, 30*time.Second, n, 8, func(rng *rand.Rand) float64 {
		return float64([]int{1, 1, 1, 1, 1, 1, 1, 1, 2, 3}[rng.IntN(10)])
	}, func(_ *rand.Rand, k float64) float64 { return 0.67 + 4.76*k })
	d := pl.Decide(end)
	if d.Best.P < 8 || d.Best.P > 12 || d.Prefill == 0 {
		t.Fatalf("best %dP:%dD, split %dP (splits%s): want a prefill pool, the best 8P–12P", d.Best.P, d.Best.D, d.Prefill, splitsOf(d))
	}
}
