package planner

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)

// traffic is one mix of requests: its prompt (all uncached) and output
// lengths and its arrival rate.
type traffic struct {
	prompt, output int
	rate           float64
}

var (
	chat       = traffic{prompt: 64, output: 256, rate: 4}
	longPrompt = traffic{prompt: 2000, output: 16, rate: 4}
)

// engines are the fake engines' costs: every engine prefills at
// prefillCost s/token, and each decode runs a batch of 4, 8, 12 or 16 (in
// turn, so that even one decode engine gives the fit several batches) at
// 10 + 2·k ms per step.
const prefillCost = 0.0002

// feed gives pl dur of tr from start (requests evenly spaced) and a scrape
// of each of n engines every second, the first p in the prefill pool.
func feed(pl *Planner, start time.Time, dur time.Duration, tr traffic, n, p int) time.Time {
	gap := time.Duration(float64(time.Second) / tr.rate)
	end := start.Add(dur)
	for at := start; at.Before(end); at = at.Add(gap) {
		pl.ObserveRequest(Request{At: at, PromptTokens: tr.prompt, UncachedTokens: tr.prompt, OutputTokens: tr.output})
	}
	for at := start; at.Before(end); at = at.Add(time.Second) {
		for i := range n {
			s := EngineSample{At: at, URL: fmt.Sprintf("http://e%d", i), PrefillSecondsPerToken: prefillCost}
			if i >= p {
				k := float64(4 + 4*((i+at.Second())%4))
				s.Decode, s.Running, s.ITLSeconds = true, k, (10+2*k)/1000
			}
			pl.ObserveEngine(s)
		}
	}
	return end
}

func newPlanner(t *testing.T, cfg Config) *Planner {
	t.Helper()
	if cfg.TTFT == 0 {
		cfg.TTFT, cfg.TPOT = 2*time.Second, 100*time.Millisecond
	}
	pl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

func TestNewRefusesAConfigWithoutObjectivesOrEngines(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no TTFT objective", Config{TPOT: time.Second, Engines: 4}, "--slo-ttft"},
		{"one engine", Config{TTFT: time.Second, TPOT: time.Second, Engines: 1}, "start more engines"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one saying %q", err, c.want)
			}
		})
	}
}

func TestDecideHoldsWithTooFewRequests(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Prefill: 2})
	now := feed(pl, t0, 2*time.Second, longPrompt, 4, 2) // 8 requests
	d := pl.Decide(now)
	if d.Changed || d.Prefill != 2 || !strings.Contains(d.Held, "too few requests") {
		t.Fatalf("got %dP:%dD changed=%v held %q, want 2P:2D held for too few requests", d.Prefill, d.Decode, d.Changed, d.Held)
	}
}

func TestDecideIgnoresStaleMetricsAndSaysSo(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Prefill: 2, MaxAge: 5 * time.Second})
	end := feed(pl, t0, 20*time.Second, longPrompt, 4, 2)
	// The scrapes stopped: 30s later only requests come.
	for at := end; at.Before(end.Add(30 * time.Second)); at = at.Add(100 * time.Millisecond) {
		pl.ObserveRequest(Request{At: at, PromptTokens: 2000, UncachedTokens: 2000, OutputTokens: 16})
	}
	d := pl.Decide(end.Add(30 * time.Second))
	if d.Changed || d.Prefill != 2 || !strings.Contains(d.Held, "stale") || d.Fit.StaleSamples == 0 {
		t.Fatalf("got %dP changed=%v held %q stale %d, want the split held for stale metrics", d.Prefill, d.Changed, d.Held, d.Fit.StaleSamples)
	}
}

// TestSplitFollowsTheTraffic shifts the traffic from chat-heavy to
// long-prompt-heavy and back and checks that the split follows: one engine
// per change, half the way after a shift (or straight to the best across a
// valley), never two changes
// within the step dwell nor a turn back within the dwell, and each phase's
// split reached within a bound: the window's recent quarter to see the new
// mix, then a step dwell per engine moved. Fitted to the whole window the
// planner would wait for the old mix to leave it, then a dwell per engine.
func TestSplitFollowsTheTraffic(t *testing.T) {
	const n = 8
	dwell, window := 10*time.Second, 20*time.Second
	// A TPOT objective tight enough that long prompts prefilled beside
	// the streams break it: long prompts want a prefill pool (with a loose
	// one the colocated split serves them nearly as well).
	pl := newPlanner(t, Config{TTFT: 2 * time.Second, TPOT: 40 * time.Millisecond, Engines: n, Prefill: 4, MinDwell: dwell, Window: window})
	step := pl.Config().StepDwell
	now := t0
	var last time.Time
	var lastDir int
	// run sends tr for phase and returns the last decision and how long
	// the split took to reach want and stay there (the phase when never).
	run := func(tr traffic, phase time.Duration, want func(p int) bool) (Decision, time.Duration) {
		var d Decision
		start, took := now, phase
		for end := now.Add(phase); now.Before(end); {
			p := pl.prefill
			now = feed(pl, now, time.Second, tr, n, p)
			d = pl.Decide(now)
			if d.Changed {
				bound := 1 // half the way after a shift
				if d.Fit.Shift != "" {
					bound = (max(d.Best.P-p, p-d.Best.P) + 1) / 2
				}
				if got := d.Prefill - p; max(got, -got) > bound && (!d.Crossed || d.Prefill != d.Best.P) {
					t.Fatalf("%v: the split moved by %d engines at once, more than %d, not across a valley to the best (%+v)", now.Sub(t0), got, bound, d)
				}
				dir, least := 1, step
				if d.Prefill < p {
					dir = -1
				}
				if dir != lastDir {
					least = dwell
				}
				if !last.IsZero() && now.Sub(last) < least {
					t.Fatalf("%v: two changes %v apart (directions %d, %d), within %v", now.Sub(t0), now.Sub(last), lastDir, dir, least)
				}
				last, lastDir = now, dir
			}
			switch {
			case !want(d.Prefill):
				took = phase
			case took == phase:
				took = now.Sub(start)
			}
		}
		return d, took
	}
	d, _ := run(chat, 60*time.Second, func(p int) bool { return p == 0 })
	if d.Prefill != 0 || d.Best.P != 0 {
		t.Fatalf("chat-heavy: %dP:%dD (best %+v), want 0P:8D, colocated: the prompts are short and every engine prefills its own (threshold %d)", d.Prefill, d.Decode, d.Best, d.Threshold)
	}
	chatThreshold := d.Threshold
	d, took := run(longPrompt, 60*time.Second, func(p int) bool { return p > 4 })
	if d.Best.P <= 4 || d.Prefill != d.Best.P {
		t.Fatalf("long-prompt-heavy: %dP:%dD, best %+v (held %q), want the split at a best of more than 4 prefill engines", d.Prefill, d.Decode, d.Best, d.Held)
	}
	if d.Threshold > 2000 {
		t.Fatalf("long-prompt-heavy: threshold %d keeps the 2000-token prompts local", d.Threshold)
	}
	// Seen in the recent quarter, then across the valley (one change)
	// and a step per engine to more than 4 (up to 4 more changes).
	if bound := window/4 + 5*step + 2*time.Second; took > bound {
		t.Fatalf("long-prompt-heavy: the split took %v to pass 4 prefill engines, more than %v", took, bound)
	}
	t.Logf("chat: threshold %d; long prompts: %dP:%dD after %v, %.2f req/s predicted, threshold %d", chatThreshold, d.Prefill, d.Decode, took, d.Best.Goodput, d.Threshold)
	from := d.Prefill
	d, took = run(chat, 60*time.Second, func(p int) bool { return p == 0 })
	if d.Prefill != 0 {
		t.Fatalf("back to chat: %dP:%dD (held %q), want 0P:8D", d.Prefill, d.Decode, d.Held)
	}
	// The first move turns back (a dwell after the last change, long
	// past), then a step per engine.
	if bound := window/4 + time.Duration(from-1)*step + 2*time.Second; took > bound {
		t.Fatalf("back to chat: the split took %v from %dP to 0P, more than %v", took, from, bound)
	}
	t.Logf("back to chat: 0P after %v", took)
}

// TestSteadyMixDoesNotFlap: a steady mix of random lengths and arrivals
// (so that the window's recent quarter differs from the rest by chance)
// is seldom taken for a shift, and the split settles and stays: no change
// turns back.
func TestSteadyMixDoesNotFlap(t *testing.T) {
	const n = 8
	// TPOT 60 ms: at 40, since a decode's capacity counts the spread of its
	// streams' batches, 3P:5D and 4P:4D are predicted within the windows'
	// swing of each other and the split went to 3P and back once in 120 s.
	pl := newPlanner(t, Config{TTFT: 2 * time.Second, TPOT: 60 * time.Millisecond, Engines: n, Prefill: 4, MinDwell: 10 * time.Second, Window: 20 * time.Second})
	rng := rand.New(rand.NewPCG(1, 2))
	at, changes, turns, lastDir, shifts := t0, 0, 0, 0, 0
	const decisions = 120
	for sec := range decisions {
		end := t0.Add(time.Duration(sec+1) * time.Second)
		for at.Before(end) {
			l := 32 + rng.IntN(3000)
			pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 16 + rng.IntN(256)})
			at = at.Add(time.Duration(rng.ExpFloat64() / 4 * float64(time.Second)))
		}
		p := pl.prefill
		for i := range n {
			s := EngineSample{At: end, URL: fmt.Sprintf("http://e%d", i), PrefillSecondsPerToken: prefillCost}
			if i >= p {
				k := float64(4 + 4*((i+sec)%4))
				s.Decode, s.Running, s.ITLSeconds = true, k, (10+2*k+rng.Float64())/1000
			}
			pl.ObserveEngine(s)
		}
		d := pl.Decide(end)
		if d.Fit.Shift != "" {
			shifts++
		}
		if d.Changed {
			changes++
			dir := cmp.Compare(d.Prefill, p)
			if lastDir != 0 && dir != lastDir {
				turns++
				t.Logf("%v: turned back to %dP:%dD (best %+v; %s)", end.Sub(t0), d.Prefill, d.Decode, d.Best, d.Fit.Shift)
			}
			lastDir = dir
		}
	}
	if turns > 0 || shifts > 1 {
		t.Fatalf("a steady mix: %d changes, %d of them turning back; %d of %d decisions saw a shift", changes, turns, shifts, decisions)
	}
}

func TestHysteresisHoldsASplitNearlyAsGoodAsTheBest(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 8, Prefill: 4, Hysteresis: 100}) // nothing beats the current split 101-fold
	now := feed(pl, t0, 30*time.Second, longPrompt, 8, 4)
	d := pl.Decide(now)
	if d.Best.P == 4 {
		t.Fatalf("the best split is the current one (%+v): no hysteresis to test", d.Best)
	}
	if d.Changed || d.Prefill != 4 || !strings.Contains(d.Held, "hysteresis") {
		t.Fatalf("got %dP changed=%v held %q, want 4P held by the hysteresis", d.Prefill, d.Changed, d.Held)
	}
}

// TestThresholdIsTheModelsBest checks that the threshold chosen is the one
// the model predicts the most goodput for at the split that runs after the
// decision, under a loose and a tight TPOT objective (local prefills
// stretch the decodes' steps).
func TestThresholdIsTheModelsBest(t *testing.T) {
	for _, tpot := range []time.Duration{time.Second, 40 * time.Millisecond} {
		pl := newPlanner(t, Config{TTFT: 2 * time.Second, TPOT: tpot, Engines: 4, Prefill: 2, MinPrefill: 1, Hysteresis: 1e-9})
		// A mix: 64-, 400- and 1000-token prompts.
		now := feed(pl, t0, 20*time.Second, traffic{prompt: 64, output: 64, rate: 2}, 4, 2)
		for at := t0; at.Before(now); at = at.Add(500 * time.Millisecond) {
			pl.ObserveRequest(Request{At: at, PromptTokens: 1000, UncachedTokens: 1000, OutputTokens: 64})
			pl.ObserveRequest(Request{At: at, PromptTokens: 400, UncachedTokens: 400, OutputTokens: 64})
		}
		d := pl.Decide(now)
		chosen := pl.model(d.Fit, d.Threshold).split(d.Prefill, d.Decode).Goodput
		for _, th := range []int{16, 65, 401, 1001} {
			if g := pl.model(d.Fit, th).split(d.Prefill, d.Decode).Goodput; g > chosen*(1+1e-6) {
				t.Errorf("TPOT %v: at %dP:%dD threshold %d predicts %.3f req/s, more than the chosen %d's %.3f", tpot, d.Prefill, d.Decode, th, g, d.Threshold, chosen)
			}
		}
		t.Logf("TPOT %v: %dP:%dD threshold %d, best %+v", tpot, d.Prefill, d.Decode, d.Threshold, d.Best)
	}
}

func TestModelOfTheFitMatchesTheFormulas(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 8, Prefill: 4})
	now := feed(pl, t0, 30*time.Second, longPrompt, 8, 4)
	d := pl.Decide(now)
	f := d.Fit
	if f.DecodeFit != "fit" || math.Abs(f.StepA-10) > 1e-6 || math.Abs(f.StepB-2) > 1e-6 {
		t.Fatalf("decode fit %s A=%v B=%v, want the engines' 10 + 2·k ms", f.DecodeFit, f.StepA, f.StepB)
	}
	// A stream's mean batch over its life is normal about the mean batch k
	// with variance 2k/3 (every stream as long as the others: lifeSpread),
	// and 90% of them within the 45 the 100-ms objective allows,
	// (100 − 10)/2: k + 1.2816·√(2k/3) = 45, k = 38.51, at a step of
	// 10 + 2k = 87.01 ms: 38.51/((16−1)·0.08701 s) = 29.50 req/s.
	z := math.Sqrt2 * math.Erfinv(0.8)
	x := (-z*math.Sqrt(2.0/3) + math.Sqrt(2*z*z/3+4*45)) / 2
	k := x * x
	if math.Abs(f.DecodeBatch-k) > 1e-3 || math.Abs(f.DecodeRate-k/(15*(10+2*k)/1000)) > 1e-3 {
		t.Fatalf("decode batch %v rate %v, want %.3f and %.3f", f.DecodeBatch, f.DecodeRate, k, k/(15*(10+2*k)/1000))
	}
	if math.Abs(f.PrefillSeconds-0.4) > 1e-9 || f.RemoteFraction != 1 {
		t.Fatalf("prefill %v s, remote fraction %v, want 0.4 s and 1", f.PrefillSeconds, f.RemoteFraction)
	}
	// The best split is the one with the most goodput of all.
	m := pl.model(f, d.Threshold)
	for p := 1; p < 8; p++ {
		if g := m.split(p, 8-p).Goodput; g > d.Best.Goodput+1e-9 {
			t.Fatalf("%dP:%dD predicts %.3f, more than the best %+v", p, 8-p, g, d.Best)
		}
	}
}

// TestNoLocalPrefillLongerThanAStreamsSlack: a prompt whose prefill would
// stall the streams it lands on past the TPOT objective by itself stays
// remote, though the mean-load model would rather prefill it on the decodes
// (three have room; the one prefill engine, kept to one by MinDecode, does
// not).
func TestNoLocalPrefillLongerThanAStreamsSlack(t *testing.T) {
	// Steps of about 10 ms, a 30 ms objective and 10-token answers: 180 ms
	// of slack, 900 tokens at 0.2 ms each; the prompts are 1500 tokens.
	pl := newPlanner(t, Config{TTFT: time.Second, TPOT: 30 * time.Millisecond, Engines: 4, Prefill: 1, MinDecode: 3, Hysteresis: 1e-9})
	end := t0.Add(20 * time.Second)
	for at := t0; at.Before(end); at = at.Add(250 * time.Millisecond) {
		pl.ObserveRequest(Request{At: at, PromptTokens: 1500, UncachedTokens: 1500, OutputTokens: 10})
	}
	for at := t0; at.Before(end); at = at.Add(time.Second) {
		pl.ObserveEngine(EngineSample{At: at, URL: "p", PrefillSecondsPerToken: prefillCost})
		for i, k := range []float64{1, 2, 3} {
			pl.ObserveEngine(EngineSample{At: at, URL: fmt.Sprint("d", i), Decode: true, PrefillSecondsPerToken: prefillCost, Running: k, ITLSeconds: (9 + 0.5*k) / 1000})
		}
	}
	d := pl.Decide(end)
	if d.Threshold > 901 || d.Fit.RemoteFraction != 1 {
		t.Fatalf("threshold %d, remote fraction %.2f: the 1500-token prompts (300 ms of prefill) would be prefilled beside streams with 180 ms of slack", d.Threshold, d.Fit.RemoteFraction)
	}
}

// BenchmarkDecide is one decision over a busy window: 32 engines, 50,000
// requests of mixed lengths.
func BenchmarkDecide(b *testing.B) {
	pl, err := New(Config{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond, Engines: 32, Prefill: 16})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 50000 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		l := 64 + (i*7919)%3000
		pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 16 + i%200})
	}
	now := t0.Add(50 * time.Second)
	for i := range 32 {
		s := EngineSample{At: now, URL: fmt.Sprint("e", i), PrefillSecondsPerToken: prefillCost}
		if i >= 16 {
			k := float64(4 + i - 16)
			s.Decode, s.Running, s.ITLSeconds = true, k, (10+2*k)/1000
		}
		pl.ObserveEngine(s)
	}
	for b.Loop() {
		pl.Decide(now)
	}
}

// TestColocatedSplit: with short prompts every engine serving its own
// prefills beats keeping one as a prefill engine, and the planner goes
// there (one engine per change) unless MinPrefill keeps a prefill pool.
func TestColocatedSplit(t *testing.T) {
	for _, c := range []struct {
		name       string
		minPrefill int
		want       int
	}{
		{"the split may be colocated", 0, 0},
		{"MinPrefill keeps a prefill engine", 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := newPlanner(t, Config{Engines: 4, Prefill: 2, MinPrefill: c.minPrefill, MinDwell: time.Second})
			now := t0
			var d Decision
			for range 30 {
				p := pl.prefill
				now = feed(pl, now, time.Second, chat, 4, p)
				d = pl.Decide(now)
			}
			if d.Prefill != c.want || d.Best.P != c.want || d.Decode != 4-c.want {
				t.Fatalf("%dP:%dD (best %+v, held %q), want %dP", d.Prefill, d.Decode, d.Best, d.Held, c.want)
			}
			if c.want == 0 && (d.Fit.RemoteFraction != 0 || d.Fit.Current.Goodput <= 0) {
				t.Fatalf("colocated: remote fraction %v, goodput %v: want every prompt local and a goodput", d.Fit.RemoteFraction, d.Fit.Current.Goodput)
			}
		})
	}
}

// TestColocatedCapacityCountsLocalPrefillQueueing: a decode engine that
// prefills its own prompts is a queue for them as a prefill engine is: at
// a loose TPOT objective its rate is bounded by its prompts' TTFT, not by
// its batch.
func TestColocatedCapacityCountsLocalPrefillQueueing(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: time.Second, TPOT: 10 * time.Second, Engines: 4})
	for at := t0; at.Before(t0.Add(20 * time.Second)); at = at.Add(250 * time.Millisecond) {
		pl.ObserveRequest(Request{At: at, PromptTokens: 2000, UncachedTokens: 2000, OutputTokens: 16})
	}
	f := Fit{PrefillSecondsPerToken: prefillCost, StepA: 10, StepB: 2, MeanBatch: 4, MeanOutput: 16, MaxBatchedTokens: 2048}
	pl.win, _, _ = pl.view(t0.Add(20 * time.Second))
	m := pl.model(f, colocatedThreshold)
	c := m.decode(0, 4)
	c.rate = m.split(0, 4).Goodput / 4
	// Each prompt takes 0.4 s of prefill and one 18-ms step: an M/G/1
	// queue (arrivals a fourth as variable as Poisson) whose 90% of waits
	// stay under 1 s − 0.418 s (the TPOT objective loose enough to miss
	// nothing) is busy well under all of the time.
	service := 0.4 + 0.018
	if c.limit != "ttft" || c.rate <= 0 || c.rate >= 1/service {
		t.Fatalf("decode capacity %+v: want it TTFT-bound at less than %.2f req/s (1/service)", c, 1/service)
	}
	rho, _ := PrefillBusy([]float64{service}, service, 0.25, 0, 0, 1, 0.9)
	if math.Abs(c.rate-rho/service) > 1e-4*rho/service { // the rate's search stops within a part in 10⁵
		t.Fatalf("decode rate %v, want ρ/s = %v", c.rate, rho/service)
	}
}

// TestObservedOutputsReplaceMaxTokens: a request's output is its
// max_tokens until it finished, then what it produced.
func TestObservedOutputsReplaceMaxTokens(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Prefill: 2})
	end := feed(pl, t0, 10*time.Second, traffic{prompt: 64, output: 1, rate: 1}, 4, 2) // the scrapes
	for i := range 40 {
		pl.ObserveRequest(Request{At: t0.Add(time.Duration(i) * 250 * time.Millisecond), ID: fmt.Sprint("r", i), PromptTokens: 64, UncachedTokens: 64, OutputTokens: 1000})
	}
	for i := range 30 {
		pl.ObserveOutput(fmt.Sprint("r", i), 10, t0)
	}
	pl.ObserveOutput("never seen", 5, t0)
	d := pl.Decide(end)
	// 10 of the scrapes' requests (output 1), 30 finished at 10, 10
	// running at their max_tokens.
	if want := (10*1 + 30*10 + 10*1000) / 50.0; d.Fit.MeanOutput != want || d.Fit.FinishedOutputs != 30 {
		t.Fatalf("mean output %v from %d finished requests, want %v from 30", d.Fit.MeanOutput, d.Fit.FinishedOutputs, want)
	}
}

// TestPinnedEnginesBoundTheSplit: with one prefill engine that cannot
// move, chat traffic does not empty the prefill pool.
func TestPinnedEnginesBoundTheSplit(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Prefill: 2, MinDwell: time.Second})
	pl.SetPinned(1, 0)
	now := t0
	var d Decision
	for range 30 {
		p := pl.prefill
		now = feed(pl, now, time.Second, chat, 4, p)
		d = pl.Decide(now)
	}
	if d.Prefill != 1 || d.Best.P != 1 {
		t.Fatalf("%dP:%dD (best %+v, held %q), want 1P: the pinned prefill engine stays", d.Prefill, d.Decode, d.Best, d.Held)
	}
}
