package planner

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestArrivalDispersion: Poisson arrivals have an index of dispersion
// near 1, evenly paced ones below it, and the P/D experiment's levels
// (60 requests sent in under a second, then none for two) far above.
func TestArrivalDispersion(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const bin = 250 * time.Millisecond
	span := 30 * time.Second
	var poisson, paced, bursts []Request
	for at := t0; at.Before(t0.Add(span)); at = at.Add(time.Duration(rng.ExpFloat64() / 20 * float64(time.Second))) {
		poisson = append(poisson, Request{At: at})
	}
	for at := t0; at.Before(t0.Add(span)); at = at.Add(50 * time.Millisecond) {
		paced = append(paced, Request{At: at})
	}
	for b := t0; b.Before(t0.Add(span)); b = b.Add(3 * time.Second) {
		for i := range 60 {
			bursts = append(bursts, Request{At: b.Add(time.Duration(i) * 750 * time.Millisecond / 60)})
		}
	}
	for _, c := range []struct {
		name   string
		reqs   []Request
		lo, hi float64
	}{
		{"poisson", poisson, 0.7, 1.4},
		{"paced", paced, 0, 0.2},
		{"bursts", bursts, 10, 30}, // 1 + (1 − f)·λ·bin = 1 + 0.75·80·0.25 = 16
	} {
		if got := arrivalDispersion(c.reqs, t0, t0.Add(span), bin); got < c.lo || got > c.hi {
			t.Errorf("%s: index of dispersion %.2f, want %g–%g", c.name, got, c.lo, c.hi)
		}
	}
	if got := arrivalDispersion(bursts, t0, t0.Add(3*bin), bin); got != 1 {
		t.Errorf("three bins: %.2f, want 1 (too few to measure)", got)
	}
}

// TestBurstsLowerTheQueuesGoodput: the same chat requests, once arriving
// as a Poisson stream and once as the P/D experiment sends a level (its
// requests in bursts of under a second), give the same traffic mix but
// not the same queues: the decodes' local prefills, which the colocated
// split queues every prompt on, wait longer behind a burst, and the model
// predicts less goodput for it (the Poisson assumption priced both
// alike). The split with a prefill pool, whose decodes queue fewer
// prompts, loses less of its goodput.
func TestBurstsLowerTheQueuesGoodput(t *testing.T) {
	type result struct {
		disp, colo, pool float64
	}
	run := func(burst bool) result {
		pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: 1,
			MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Minute})
		rng := rand.New(rand.NewPCG(5, 6))
		now := t0.Add(3 * time.Second)
		chatMix(pl, rng, t0, now, 20)
		if burst { // the same requests, in two bursts of 0.75 s
			n := len(pl.reqs)
			for i := range pl.reqs {
				b := t0.Add(time.Duration(i/(n/2+1)) * 1500 * time.Millisecond)
				pl.reqs[i].At = b.Add(time.Duration(i%(n/2+1)) * 750 * time.Millisecond / time.Duration(n/2+1))
			}
		}
		for i := range 6 {
			chatEngines(pl, rng, t0.Add(time.Duration(i+1)*500*time.Millisecond), 4, 1, i)
		}
		for _, r := range pl.reqs {
			pl.ObservePrefill(PrefillSample{At: r.At, URL: "e0", Tokens: r.UncachedTokens, Seconds: simPrefill(r.UncachedTokens)})
		}
		pl.lastChange = now
		d := pl.Decide(now)
		var res result
		res.disp = d.Fit.ArrivalDispersion
		for _, s := range d.Splits {
			switch s.P {
			case 0:
				res.colo = s.Goodput
			case 1:
				res.pool = s.Goodput
			}
		}
		return res
	}
	poisson, burst := run(false), run(true)
	t.Logf("poisson %+v, bursts %+v", poisson, burst)
	if burst.disp < 4 || poisson.disp > 2 {
		t.Fatalf("index of dispersion %.2f for the bursts, %.2f for the Poisson stream: want more than 4 and under 2", burst.disp, poisson.disp)
	}
	if burst.colo > 0.9*poisson.colo {
		t.Errorf("colocated: %.2f req/s from the bursts, %.2f from the Poisson stream: want the bursts' at least 10%% less", burst.colo, poisson.colo)
	}
	if burst.pool/poisson.pool < burst.colo/poisson.colo {
		t.Errorf("1P:3D kept %.2f of its goodput in the bursts, colocated %.2f: want the split with a prefill pool to lose less",
			burst.pool/poisson.pool, burst.colo/poisson.colo)
	}
}
