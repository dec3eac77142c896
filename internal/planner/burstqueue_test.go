package planner

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestBurstQueueAllAtOnce: a burst arriving all at once on one engine of
// fixed service s is served in turn, the j-th request's TTFT j·s: with a
// 1-s objective and s = 0.3 s, three of every ten meet it. On two engines
// the burst is shared, six of ten. Alone (rate 0) every request meets it.
func TestBurstQueueAllAtOnce(t *testing.T) {
	kinds := []burstKind{burstLocal}
	q := newBurstQueue(10, kinds, []float64{0}, []float64{300}, PrefillCurve{B: 0.001}, 300)
	for _, c := range []struct {
		d    int
		rate float64
		want float64
	}{{1, 1e12, 0.3}, {2, 1e12, 0.6}, {1, 0, 1}} {
		met, remote, local := q.met(0, c.d, c.rate, 0, 1, 0, 0)
		if math.Abs(met-c.want) > 1e-9 || remote != 0 || math.Abs(local-(1-c.want)) > 1e-9 {
			t.Errorf("%d decodes at %g req/s: met %.3f (remote misses %.3f, local %.3f), want %.3f", c.d, c.rate, met, remote, local, c.want)
		}
	}
	// A remote prompt's TTFT counts its transfer and decode leg; with no
	// prefill engine it cannot be served.
	q = newBurstQueue(10, []burstKind{burstRemote}, []float64{0.3}, []float64{0}, PrefillCurve{}, 1)
	if met, remote, _ := q.met(1, 1, 1e12, 0, 1, 0.05, 0.15); math.Abs(met-0.2) > 1e-9 || math.Abs(remote-0.8) > 1e-9 {
		t.Errorf("remote burst: met %.3f, remote misses %.3f; want 0.2 and 0.8 (0.3·j + 0.2 ≤ 1 for j ≤ 2)", met, remote)
	}
	if met, remote, _ := q.met(0, 1, 1, 0, 1, 0, 0); met != 0 || remote != 1 {
		t.Errorf("remote burst without prefill engines: met %.3f, remote misses %.3f; want 0 and 1", met, remote)
	}
	// Cached prompts meet it whatever the load.
	q = newBurstQueue(10, []burstKind{burstCached}, []float64{0}, []float64{0}, PrefillCurve{}, 1)
	if met, _, _ := q.met(0, 1, 1e12, 0, 0.001, 0, 0); met != 1 {
		t.Errorf("cached burst: met %.3f, want 1", met)
	}
}

// TestBurstQueueAgainstMD1: a long burst at a rate the engine can carry
// (ρ = 0.5, Poisson arrivals, fixed service) approaches the M/D/1 queue's
// stationary waits: P(W ≤ 0) = 1 − ρ. And a faster burst never meets more
// (the same draws, the gaps scaled down).
func TestBurstQueueAgainstMD1(t *testing.T) {
	q := newBurstQueue(512, []burstKind{burstLocal}, []float64{0}, []float64{1000}, PrefillCurve{B: 0.001}, 1000)
	// Waits of zero: TTFT exactly the service. An objective just above it.
	met, _, _ := q.met(0, 1, 0.5, 0, 1+1e-9, 0, 0)
	if met < 0.45 || met > 0.6 {
		t.Errorf("ρ = 0.5: %.3f of the requests wait for nothing, want about 0.5 (M/D/1 stationary, a burst starting empty a little more)", met)
	}
	prev := 1.0
	for _, rate := range []float64{0.1, 0.3, 0.5, 0.8, 1, 2, 8} {
		met, _, _ := q.met(0, 1, rate, 0, 3, 0, 0)
		if met > prev+1e-12 {
			t.Errorf("at %g req/s %.3f met, more than %.3f at the rate below", rate, met, prev)
		}
		prev = met
	}
}

// BenchmarkDecideBursts is one decision over a window of bursts at 32
// engines: bursts of 512 requests of mixed lengths, 10 s apart.
func BenchmarkDecideBursts(b *testing.B) {
	pl, err := New(Config{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond, Engines: 32, Prefill: 16, Window: 60 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	at := t0
	for i := range 8 * 512 {
		if i%512 == 0 {
			at = at.Add(10 * time.Second)
		}
		at = at.Add(time.Millisecond)
		l := 64 + (i*7919)%3000
		pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 16 + i%200})
	}
	now := at.Add(10 * time.Second)
	for i := range 32 {
		s := EngineSample{At: now, URL: fmt.Sprint("e", i), PrefillSecondsPerToken: prefillCost}
		if i >= 16 {
			k := float64(4 + i - 16)
			s.Decode, s.Running, s.ITLSeconds = true, k, (10+2*k)/1000
		}
		pl.ObserveEngine(s)
	}
	if d := pl.Decide(now); d.Fit.BurstRequests == 0 {
		b.Fatalf("no burst seen (dispersion %.2f)", d.Fit.ArrivalDispersion)
	}
	for b.Loop() {
		pl.Decide(now)
	}
}
