package planner

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// chatLevels feeds pl the P/D experiment's chat levels as its adaptive
// planner saw them (issue 26's SLO grid, 4 engines): each level's 60
// requests at its rate, then the level's drain (no request) until the next
// begins, a scrape of the engines every 250 ms and a decision every
// 0.8 s; the decodes' inter-token latencies carry up to noise ms more
// (exponential). It returns each decision, and the arrivals.
func chatLevels(t *testing.T, pl *Planner, seed uint64, rates []float64, noise float64) (ds []Decision, arrivals []time.Time) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	const (
		perLevel = 60
		drain    = 2 * time.Second
		every    = 800 * time.Millisecond
		scrape   = 250 * time.Millisecond
	)
	at := t0
	for _, r := range rates {
		for range perLevel {
			arrivals = append(arrivals, at)
			at = at.Add(time.Duration(rng.ExpFloat64() / r * float64(time.Second)))
		}
		at = at.Add(drain)
	}
	end := at
	next, i := 0, 0
	for now := t0.Add(every); now.Before(end); now = now.Add(every) {
		from := len(pl.reqs)
		for ; next < len(arrivals) && arrivals[next].Before(now); next++ {
			chatMix(pl, rng, arrivals[next], arrivals[next].Add(time.Nanosecond), 1)
			pl.reqs[len(pl.reqs)-1].At = arrivals[next]
		}
		retimeArrivals(pl)
		for _, r := range pl.reqs[from:] {
			pl.ObservePrefill(PrefillSample{At: r.At, URL: "e0", Tokens: r.UncachedTokens, Seconds: simPrefill(r.UncachedTokens) * (1 + 0.1*rng.Float64())})
		}
		for s := now.Add(-every + scrape); !s.After(now); s = s.Add(scrape) {
			for e := range pl.cfg.Engines {
				es := EngineSample{At: s, URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.000217 * (1 + 0.1*rng.Float64()), TransferSecondsPerToken: 2e-6}
				if e >= pl.prefill {
					k := float64(2 + 4*((e+i)%4))
					es.Decode, es.Running, es.ITLSeconds = true, k, (1.5+0.5*k+noise*rng.ExpFloat64())/1000
				}
				pl.ObserveEngine(es)
			}
			i++
		}
		ds = append(ds, pl.Decide(now))
	}
	return ds, arrivals
}

// TestMovesInsideALevelWaitForTheNewSplit is the grid's cell TTFT ×2 /
// TPOT ×0.5 (500 ms, 12.5 ms) as its planner saw it: a 3-s window, a
// dwell of 1.5 s (0.375 s for a step on in the same direction), a
// decision every 0.8 s, levels of 60 requests at 10, 20, 40 and 80 req/s
// from the colocated split, the decodes' scrapes noisy as on a loaded
// host. On main the split moved again a decision after a move, on a
// window of the requests the old split served (seed 5: 0P:4D → 2P:2D at
// 8.8 s on 21 requests, → 1P:3D at 10.4 s, → 0P:4D at 11.2 s; seed 4 the
// same at 14.4, 16 and 16.8 s; the engines' run: 0P:4D → 1P:3D → 2P:2D →
// 1P:3D → 0P:4D in 3.2 s, the first two 0.8 s apart). A move must now
// wait until the requests since the last one are most of those it is
// decided on, and the decisions in between say so.
func TestMovesInsideALevelWaitForTheNewSplit(t *testing.T) {
	shown := 0 // seeds whose run moved twice and held a move while settling
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		pl := newPlanner(t, Config{TTFT: 500 * time.Millisecond, TPOT: 12500 * time.Microsecond, Engines: 4, Prefill: 0,
			MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: 1500 * time.Millisecond})
		ds, arrivals := chatLevels(t, pl, seed, []float64{10, 20, 40, 80}, float64(seed%4))
		var changes, settling int
		var last time.Time
		for _, d := range ds {
			if strings.Contains(d.Held, "settling after the move") {
				settling++
			}
			if !d.Changed {
				continue
			}
			changes++
			t.Logf("seed %d %v: %dP:%dD (best %dP %.1f, now %.1f, %d fitted)", seed, d.At.Sub(t0), d.Prefill, d.Decode, d.Best.P, d.Best.Goodput, d.Fit.Current.Goodput, d.Fit.Requests)
			if !last.IsZero() && d.Fit.Shift == "" {
				n := 0 // the requests since the last change
				for _, at := range arrivals {
					if !at.Before(last) && at.Before(d.At) {
						n++
					}
				}
				if need := settleRequests(pl.cfg, d.Fit.Requests); n < need {
					t.Errorf("seed %d, %v: the split moved to %dP:%dD %v after the last move, with %d requests since it of the %d fitted (want %d)",
						seed, d.At.Sub(t0), d.Prefill, d.Decode, d.At.Sub(last), n, d.Fit.Requests, need)
				}
			}
			last = d.At
		}
		t.Logf("seed %d: %d changes, %d decisions held while settling", seed, changes, settling)
		if changes >= 2 && settling > 0 {
			shown++
		}
	}
	// The model moves on some seeds' noise and not on others' (the burst
	// bound keeps most runs at one split; seed 5 moves three times, twice held
	// while settling): the rule must hold on every seed,
	// and the case must show on some.
	if shown == 0 {
		t.Errorf("%d seeds moved twice with a move held while settling: the case shows nothing", shown)
	}
}

// TestShiftMovesBeforeTheLastMoveIsMeasured: after a shift of the mix
// from chat to long prompts the split is several engines from the new
// mix's best, and a move the model predicts more than noiseLeads
// hystereses ahead goes on at the step dwell, however few requests the
// last move has seen (the model is fitted to the new mix alone: the lead
// is the mix's). A step with less of a lead waits for the last move to be
// measured.
func TestShiftMovesBeforeTheLastMoveIsMeasured(t *testing.T) {
	const n = 8
	cfg := Config{TTFT: 2 * time.Second, TPOT: 40 * time.Millisecond, Engines: n, Prefill: 1, MinPrefill: 1, MinDwell: 8 * time.Second, Window: 20 * time.Second}
	pl := newPlanner(t, cfg)
	now := feed(pl, t0, 30*time.Second, chat, n, 1)
	pl.Decide(now)
	var last time.Time
	var early, settled int
	for range 30 {
		p := pl.prefill
		now = feed(pl, now, time.Second, longPrompt, n, p)
		d := pl.Decide(now)
		if !d.Changed {
			if strings.Contains(d.Held, "settling") {
				settled++
				if d.Fit.Shift != "" && d.Best.Goodput >= d.Fit.Current.Goodput*(1+noiseLeads*pl.cfg.Hysteresis) {
					t.Errorf("%v: held %q with the best %.2f against %.2f after a shift: want the move at once", now.Sub(t0), d.Held, d.Best.Goodput, d.Fit.Current.Goodput)
				}
			}
			continue
		}
		if !last.IsZero() {
			since := int(now.Sub(last).Seconds() * longPrompt.rate) // feed's requests since the last move
			if since < settleRequests(pl.cfg, d.Fit.Requests) {
				early++
				if d.Fit.Shift == "" || d.Best.Goodput < d.Fit.Current.Goodput*(1+noiseLeads*pl.cfg.Hysteresis) {
					t.Errorf("%v: %dP → %dP with %d requests since the last move (shift %q, best %.2f against %.2f): want it held while settling",
						now.Sub(t0), p, d.Prefill, since, d.Fit.Shift, d.Best.Goodput, d.Fit.Current.Goodput)
				}
			}
		}
		last = now
	}
	if early == 0 {
		t.Fatal("no move after the shift went before the last was measured: the exemption is not shown")
	}
	t.Logf("%d moves before the last was measured, %d decisions held settling; at %dP", early, settled, pl.prefill)
}

// TestAppliedStartsTheMeasurement: with Config.ReportsApplied the split
// does not move again until the caller says the last change took effect,
// and then counts the requests from that time, not from the decision; a
// report of another split is ignored.
func TestAppliedStartsTheMeasurement(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 500 * time.Millisecond, TPOT: 12500 * time.Microsecond, Engines: 4, Prefill: 2,
		MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Millisecond, ReportsApplied: true})
	// A change 2 s ago to 2P:2D, then a steady chat window: any move now
	// would be the next one.
	rng := rand.New(rand.NewPCG(1, 2))
	now := t0.Add(3 * time.Second)
	chatMix(pl, rng, t0, now, 20)
	for i := range 12 {
		chatEngines(pl, rng, t0.Add(time.Duration(i+1)*250*time.Millisecond), 4, 2, i)
	}
	pl.lastChange, pl.lastDir = now.Add(-2*time.Second), -1
	d := pl.Decide(now)
	if d.Best.P == 2 {
		t.Fatalf("the best split is the current one (%+v): nothing to hold", d.Best)
	}
	if d.Changed || !strings.Contains(d.Held, "have not switched pools") || d.Settling != d.Held {
		t.Fatalf("before Applied: changed %v, held %q, settling %q; want held until the engines switched", d.Changed, d.Held, d.Settling)
	}
	pl.Applied(now.Add(-1900*time.Millisecond), 3) // another split's engines
	if d = pl.Decide(now); !strings.Contains(d.Held, "have not switched pools") {
		t.Fatalf("after Applied for 3P: held %q, want still waiting for 2P", d.Held)
	}
	// Applied 0.5 s ago: few of the window's requests are the new split's.
	pl.Applied(now.Add(-500*time.Millisecond), 2)
	if d = pl.Decide(now); d.Changed || !strings.Contains(d.Held, "requests measured on it") {
		t.Fatalf("applied 0.5 s ago: changed %v, held %q; want held for the requests since", d.Changed, d.Held)
	}
	// Two more seconds of chat on the new split: most of the window.
	later := now.Add(2 * time.Second)
	chatMix(pl, rng, now, later, 20)
	for i := range 8 {
		chatEngines(pl, rng, now.Add(time.Duration(i+1)*250*time.Millisecond), 4, 2, i)
	}
	if d = pl.Decide(later); d.Settling != "" || strings.Contains(d.Held, "settling") {
		t.Fatalf("2.5 s after Applied: held %q, settling %q; want the change measured", d.Held, d.Settling)
	}
	t.Logf("measured: %dP:%dD, best %+v, held %q", d.Prefill, d.Decode, d.Best, d.Held)
}
