package planner

import (
	"fmt"
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
			retimeArrivals(pl)
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

// TestLargestBurst: the P/D experiment's rounds (60 requests in 0.75 s,
// then nothing until they finish) are bursts of 60; a sustained stream
// shows no burst's end.
func TestLargestBurst(t *testing.T) {
	var rounds, steady []Request
	for _, b := range []time.Duration{0, 2500 * time.Millisecond} {
		for i := range 60 {
			rounds = append(rounds, Request{At: t0.Add(b + time.Duration(i)*750*time.Millisecond/60)})
		}
	}
	for i := range 60 {
		steady = append(steady, Request{At: t0.Add(time.Duration(i) * 50 * time.Millisecond)})
	}
	life := time.Second
	if got := largestBurst(rounds, t0.Add(3250*time.Millisecond), life); got != 60 {
		t.Errorf("two rounds of 60: largest burst %d, want 60", got)
	}
	if got := largestBurst(rounds[:90], t0.Add(3*time.Second), life); got != 60 {
		t.Errorf("a round and half the next, still arriving: largest burst %d, want 60", got)
	}
	if got := largestBurst(steady, t0.Add(3*time.Second), life); got != 0 {
		t.Errorf("a steady stream: largest burst %d, want 0 (no burst's end seen)", got)
	}
	if got := largestBurst(steady, t0.Add(5*time.Second), life); got != 60 {
		t.Errorf("a stream that stopped two seconds ago: largest burst %d, want 60", got)
	}
}

// TestBurstsEndWhereTheAnswersDid: the long workload's rounds (16
// requests over 1.26 s at 16 req/s, the next round when the last answer
// of this one has ended) are told apart by their answers' ends wherever
// those fall. Arrival gaps alone (a stream's life, 2.4 s) merged rounds
// whose gap was shorter than a life and took them as one burst of 32–48;
// and a request still being answered holds its burst open past a gap.
func TestBurstsEndWhereTheAnswersDid(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: 0, Window: 15 * time.Second})
	at := t0
	var last time.Time
	for round := range 3 {
		var ends time.Time
		for i := range 16 {
			a := at.Add(time.Duration(i) * 80 * time.Millisecond)
			id := fmt.Sprint(round, "-", i)
			pl.ObserveRequest(Request{At: a, ID: id, PromptTokens: 1400, UncachedTokens: 1400, OutputTokens: 200})
			end := a.Add(time.Duration(1500+100*(i%5)) * time.Millisecond)
			pl.ObserveOutput(id, 200, end)
			ends = later(ends, end)
		}
		last = at.Add(15 * 80 * time.Millisecond)
		at = ends.Add(100 * time.Millisecond) // the next round starts when this one has ended
	}
	life := 2400 * time.Millisecond
	if gap := at.Add(-100 * time.Millisecond).Sub(last); gap >= life {
		t.Fatalf("the rounds' gap %v is not shorter than a life: the case shows nothing", gap)
	}
	if got := largestBurst(pl.arrivals, at, life); got != 16 {
		t.Errorf("three rounds of 16 each ended before the next: largest burst %d, want 16", got)
	}
	// Without their answers' ends the rounds merge, as before.
	bare := make([]Request, len(pl.arrivals))
	for i, r := range pl.arrivals {
		bare[i] = Request{At: r.At}
	}
	if got := largestBurst(bare, at.Add(10*time.Second), life); got != 48 {
		t.Errorf("the rounds without their answers' ends: largest burst %d, want 48 (merged by arrival gaps)", got)
	}
	// A request still being answered (no end told) past its life keeps
	// its round's burst open only for a life.
	pl.ObserveRequest(Request{At: at, ID: "open", PromptTokens: 1400, UncachedTokens: 1400, OutputTokens: 200})
	if got := largestBurst(pl.arrivals, at.Add(time.Second), life); got != 16 {
		t.Errorf("a fourth round begun: largest burst %d, want 16", got)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestBurstBoundsTheDecodeBatch: a window of the P/D experiment's rounds
// at 80 req/s (60 requests in 0.75 s, the next 1.75 s later). A sustained
// 30 req/s would hold more streams on each of two decodes than their 64
// seats (the chat mix's outputs of ~230 tokens at a step of 10–18 ms):
// the model priced 2P:2D by that and ranked it below the splits with more
// decodes. A round's 60 requests hold a decode of two at 30 streams
// however fast they arrive, and 2P:2D is valued by that.
func TestBurstBoundsTheDecodeBatch(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: 2,
		MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Minute})
	rng := rand.New(rand.NewPCG(5, 6))
	now := t0.Add(3 * time.Second)
	chatMix(pl, rng, t0, now, 40)
	pl.reqs = pl.reqs[:min(len(pl.reqs), 120)]
	for i := range pl.reqs { // two rounds of 60 at 80 req/s
		pl.reqs[i].At = t0.Add(time.Duration(i/60)*2500*time.Millisecond + time.Duration(i%60)*750*time.Millisecond/60)
	}
	retimeArrivals(pl)
	for i := range 6 {
		chatEngines(pl, rng, t0.Add(time.Duration(i+1)*500*time.Millisecond), 4, 2, i)
	}
	for _, r := range pl.reqs {
		pl.ObservePrefill(PrefillSample{At: r.At, URL: "e0", Tokens: r.UncachedTokens, Seconds: simPrefill(r.UncachedTokens)})
	}
	pl.lastChange = now
	d := pl.Decide(now.Add(250 * time.Millisecond))
	if d.Fit.BurstRequests != 60 {
		t.Fatalf("burst of %d requests, want 60", d.Fit.BurstRequests)
	}
	m := pl.model(d.Fit, 256)
	if a := m.attainment(2, 2, 80); a.batch > 30 {
		t.Errorf("2P:2D at 80 req/s: a decode's batch %.1f, want at most the round's 30", a.batch)
	}
	burst := m.split(2, 2).Goodput
	f := d.Fit
	f.BurstRequests = 0
	steady := pl.model(f, 256).split(2, 2).Goodput
	t.Logf("2P:2D at 256 tokens: %.1f req/s in rounds of 60, %.1f sustained", burst, steady)
	if burst < 1.1*steady {
		t.Errorf("2P:2D at 256 tokens: %.1f req/s in rounds of 60, %.1f sustained: want the rounds' at least 10%% more", burst, steady)
	}
}

// TestSparseArrivalsAreNotBursts: Poisson arrivals at 2 req/s leave gaps
// longer than a stream's life, but they are not bursts of a fixed size:
// at the rates the model weighs they would merge. The window's largest
// burst is not measured for them.
func TestSparseArrivalsAreNotBursts(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: 2,
		MaxBatchedTokens: 512, Window: 30 * time.Second})
	rng := rand.New(rand.NewPCG(3, 4))
	now := t0.Add(30 * time.Second)
	chatMix(pl, rng, t0, now, 2)
	for i := range 6 {
		chatEngines(pl, rng, now.Add(-time.Duration(i)*time.Second), 4, 2, i)
	}
	d := pl.Decide(now)
	if d.Fit.ArrivalDispersion >= burstyDispersion || d.Fit.BurstRequests != 0 {
		t.Errorf("Poisson at 2 req/s: index of dispersion %.2f, largest burst %d; want under %g and 0", d.Fit.ArrivalDispersion, d.Fit.BurstRequests, float64(burstyDispersion))
	}
}

// retimeArrivals makes pl's arrival times those of its requests, after a
// test moved them.
func retimeArrivals(pl *Planner) {
	pl.arrivals = pl.arrivals[:0]
	for _, r := range pl.reqs {
		pl.arrivals = append(pl.arrivals, Request{At: r.At})
	}
}
