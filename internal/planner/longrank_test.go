package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// longPrompts and longOutputs are the P/D experiment's long workload at
// seed 2 (`tandem bench experiment pd --workloads long --requests 16 --seed
// 2`): its 16 prompts' tokens and their answers' in the order sent, each
// level and round the same.
var (
	longPrompts = []int{1335, 1730, 1555, 1400, 1798, 1639, 1466, 1445, 1116, 1267, 1636, 1312, 1186, 1081, 1424, 1113}
	longOutputs = []int{275, 229, 218, 212, 199, 140, 181, 229, 243, 128, 257, 124, 177, 287, 231, 107}
)

// longLevelsPlanner is the long workload's balanced cell at four engines
// (TTFT 1.25 s, TPOT 25 ms, window 15 s, --max-num-batched-tokens 512) a
// second into its 8 req/s level, the split at p prefill engines: levels of
// 16 requests (1,024–2,048-token prompts, 100–300-token answers) at 2 and 4
// req/s, each drained before the next, then the 8 req/s level's first
// second. The prefills are the simulated engines' curve (simPrefill) and
// the decodes' steps the simulated engine's at long contexts (simStep) at
// batches 1–16.
func longLevelsPlanner(t *testing.T, p int) (*Planner, time.Time) {
	t.Helper()
	pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: p,
		MaxBatchedTokens: 512, Window: 15 * time.Second, MinDwell: time.Minute})
	rng := rand.New(rand.NewPCG(26, 13))
	level := func(start time.Time, rate float64, n int) time.Time {
		for i := range n {
			at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			l := longPrompts[i%len(longPrompts)]
			pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: longOutputs[i%len(longOutputs)]})
			pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: simPrefill(l)})
		}
		return start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
	}
	at := level(t0, 2, 16)
	at = level(at.Add(4*time.Second), 4, 16)
	at = at.Add(5 * time.Second)
	level(at, 8, 8)
	now := at.Add(time.Second)
	for i := range 15 {
		s := now.Add(-time.Duration(i) * time.Second)
		for e := range 4 {
			es := EngineSample{At: s, URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.00035, TransferSecondsPerToken: 2e-6}
			if e >= p {
				k := float64(1 + (i*7+e*5)%16)
				es.Decode, es.Running, es.ITLSeconds = true, k, scrapedSimStep(rng, k)/1000
			}
			pl.ObserveEngine(es)
		}
	}
	pl.lastChange = now
	return pl, now
}

// TestLongBurstRanksColocatedAboveThreePrefills is issue 26's long
// balanced cell (16 requests a level): colocated (0P:4D) met 100 / 100 /
// 100% of the SLO at 2 / 4 / 8 req/s with no stream past the TPOT
// objective (its worst 19.8 ms), conditional-3p1d 100 / 100 / 77%, every
// miss a remote prompt's TTFT; the planner moved to 3P:1D. The model
// priced the colocated decodes' local prefills as stalling their streams
// past the objective (0.57 of them at 4 req/s): a stream held by a burst
// waited through all of the decode's share of it and the prefill work
// found under way, where the burst's prompts ahead of it are prefilled
// before its first token and only those after it stall its steps.
func TestLongBurstRanksColocatedAboveThreePrefills(t *testing.T) {
	for _, p := range []int{3, 0} {
		pl, now := longLevelsPlanner(t, p)
		d := pl.Decide(now)
		by := map[int]float64{}
		for _, s := range d.Splits {
			by[s.P] = s.Goodput
		}
		m := pl.model(d.Fit, colocatedThreshold)
		a := m.attainment(0, 4, 4)
		t.Logf("running %dP:%dD: burst %d, splits%s; 0P:4D at 4 req/s: TPOT misses %.2f, local TTFT %.2f",
			p, 4-p, d.Fit.BurstRequests, splitsOf(d), a.tpotMiss, a.localMiss)
		if d.Fit.BurstRequests != 16 {
			t.Errorf("largest burst %d, want the levels' 16", d.Fit.BurstRequests)
		}
		if a.tpotMiss > 0.1 {
			t.Errorf("0P:4D at 4 req/s: %.2f of the streams predicted past the TPOT objective, want at most 0.1 (measured none)", a.tpotMiss)
		}
		if by[0] <= by[3] {
			t.Errorf("0P:4D predicted %.2f req/s, 3P:1D %.2f: want 0P:4D above (measured 100%% against 77%% at 8 req/s)", by[0], by[3])
		}
	}
}

// TestLongBurstPredictsTheMeasuredLevels holds the model's attainment on
// the long balanced cell's levels against what the P/D experiment measured
// for each static split there (the SLO grid's three rounds, 48 requests a
// level: colocated 100 / 100 / 100 / 69% at 2 / 4 / 8 / 16 req/s,
// conditional-3p1d 100 / 100 / 77 / 33%, conditional-2p2d 100 / 92 / 27 /
// 23%, conditional-1p3d 56 / 12 / 12 / 12%), each level within 0.2, and
// ranks the splits as their measured goodput does (colocated 10.6 req/s,
// 3P:1D 5.8, 2P:2D 4.1). The experiment's arrivals at seed 2 are one draw
// of Poisson gaps, scaled by the level's rate: its 15 gaps span 20.1/λ s
// where their mean is 15/λ, so each level is valued at the rate its draw
// ran at, 0.746λ. Valued as a sustained rate with the bursts' dispersion,
// 3P:1D at 4 req/s was predicted to meet 41%.
func TestLongBurstPredictsTheMeasuredLevels(t *testing.T) {
	measured := map[int][]float64{0: {1, 1, 1, 0.69}, 3: {1, 1, 0.77, 0.33}, 2: {1, 0.92, 0.27, 0.23}, 1: {0.56, 0.12, 0.12, 0.12}}
	rates := []float64{2, 4, 8, 16}
	pl, now := longLevelsPlanner(t, 3)
	d := pl.Decide(now)
	by := map[int]float64{}
	for _, s := range d.Splits {
		by[s.P] = s.Goodput
	}
	for p := 0; p <= 3; p++ {
		th := colocatedThreshold
		if p > 0 {
			th = 16 // every prompt remote, as conditional's did (all over 256 tokens)
		}
		m := pl.model(d.Fit, th)
		var got []float64
		for i, r := range rates {
			a := m.attainment(p, 4-p, r*15/20.1)
			got = append(got, a.met)
			if math.Abs(a.met-measured[p][i]) > 0.2 {
				t.Errorf("%dP:%dD at %g req/s: predicted %.2f met, measured %.2f", p, 4-p, r, a.met, measured[p][i])
			}
		}
		t.Logf("%dP:%dD predicted %.2f, measured %.2f; goodput %.2f req/s", p, 4-p, got, measured[p], by[p])
	}
	if !(by[0] > by[3] && by[3] > by[2]) {
		t.Errorf("predicted goodput 0P %.2f, 3P %.2f, 2P %.2f: want them in the measured order", by[0], by[3], by[2])
	}
}
