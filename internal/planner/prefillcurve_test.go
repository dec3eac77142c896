package planner

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// simPrefill is the simulated engines' built-in profile's prefill curve,
// wall clock at --sim-speed 4 (s): 16 tokens 3.5 ms, 512 tokens 92 ms,
// 1,024 tokens 445 ms. Its per-token cost averaged over the chat mix,
// 0.22 ms, prices a 1,024-token prompt at 222 ms.
func simPrefill(n int) float64 {
	xs := []float64{1, 16, 64, 128, 256, 512, 1024, 2048}
	ys := []float64{0.005350939, 0.013900527, 0.03850593, 0.073058088, 0.155040425, 0.367321717, 1.778269528, 2.899281758}
	x := float64(n)
	i := 1
	for i < len(xs)-1 && x > xs[i] {
		i++
	}
	return (ys[i-1] + (ys[i]-ys[i-1])*(x-xs[i-1])/(xs[i]-xs[i-1])) / 4
}

func TestPrefillCurveFitsTheMeasuredPrefills(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	curve := func(n float64) float64 { return 0.004 + 1e-4*n + 2e-7*n*n }
	for _, c := range []struct {
		name                string
		remote, local       int
		scraped             float64
		wantSource          string
		wantA, wantB, wantC float64
	}{
		{name: "a curve from the prefill engines' samples", remote: 200, local: 50, wantSource: "measured", wantA: 0.004, wantB: 1e-4, wantC: 2e-7},
		{name: "the decodes' own samples where the prefill engines measured too few", remote: 3, local: 100, wantSource: "measured", wantA: 0.004, wantB: 1e-4, wantC: 2e-7},
		{name: "the scraped per-token cost with too few samples", remote: 3, local: 4, scraped: 3e-4, wantSource: "scraped", wantB: 3e-4},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := newPlanner(t, Config{Engines: 4})
			obs := func(n int, local bool) {
				tokens := 16 + rng.IntN(2000)
				sec := curve(float64(tokens)) * (1 + 0.02*rng.NormFloat64())
				if local {
					sec = curve(float64(tokens)) // a decode's own: the same curve here
				}
				pl.ObservePrefill(PrefillSample{At: t0, URL: "e", Tokens: tokens, Seconds: sec, Local: local})
			}
			for range c.remote {
				obs(0, false)
			}
			for range c.local {
				obs(0, true)
			}
			got := pl.prefillCurve(t0.Add(-time.Second), c.scraped)
			if got.Source != c.wantSource {
				t.Fatalf("curve %+v, want source %q", got, c.wantSource)
			}
			want := PrefillCurve{A: c.wantA, B: c.wantB, C: c.wantC}
			for _, n := range []float64{16, 128, 512, 2000} {
				if g, w := got.Seconds(n), want.Seconds(n); math.Abs(g-w) > 0.05*w {
					t.Fatalf("curve %+v: %.1f ms at %v tokens, want %v + %v·n + %v·n² (%.1f ms)", got, 1000*g, n, c.wantA, c.wantB, c.wantC, 1000*w)
				}
			}
		})
	}
}

func TestPrefillCurveKeepsNoNegativeTerm(t *testing.T) {
	// A concave set of points (per-token cost falling with length): the
	// unconstrained quadratic has C < 0, which would price long prompts
	// below nothing.
	var xs, ys []float64
	for n := 64.0; n <= 2048; n *= 2 {
		xs = append(xs, n)
		ys = append(ys, 0.01+0.02*math.Sqrt(n))
	}
	c, ok := fitPrefillCurve(xs, ys)
	if !ok || c.A < 0 || c.B < 0 || c.C < 0 {
		t.Fatalf("curve %+v (ok %v), want one with no negative term", c, ok)
	}
	if _, ok := fitPrefillCurve([]float64{100, 100, 110}, []float64{1, 1, 1}); ok {
		t.Fatal("a curve fitted to lengths within 10% of each other, want per-token instead")
	}
}

func TestPrefillSamplesLeaveWithTheWindow(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Window: 10 * time.Second})
	for i := range 20 {
		pl.ObservePrefill(PrefillSample{At: t0.Add(time.Duration(i) * time.Second), Tokens: 100 * (1 + i%5), Seconds: 0.01 * float64(1+i%5)})
	}
	pl.trim(t0.Add(20 * time.Second))
	if len(pl.prefills) != 10 {
		t.Fatalf("%d samples kept, want the window's 10", len(pl.prefills))
	}
}

// TestLocalPromptLimitFromThePrefillCurve: the chat run's case. Priced per
// token (the scraped mean, 0.22 ms), a 1,024-token prompt prefills in
// 222 ms, within the 250-ms TTFT objective, so the planner would keep any
// prompt of the chat mix local; the engines' curve takes 445 ms for it.
// The longest prompt a decode may prefill itself comes from the curve
// fitted to the measured prefills.
func TestLocalPromptLimitFromThePrefillCurve(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: 2,
		MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Minute})
	rng := rand.New(rand.NewPCG(5, 6))
	now := t0.Add(3 * time.Second)
	chatMix(pl, rng, t0, now, 20)
	for i := range 6 {
		chatEngines(pl, rng, t0.Add(time.Duration(i+1)*500*time.Millisecond), 4, 2, i)
	}
	for _, r := range pl.reqs {
		pl.ObservePrefill(PrefillSample{At: r.At, URL: "e0", Tokens: r.UncachedTokens, Seconds: simPrefill(r.UncachedTokens)})
	}
	d := pl.Decide(now)
	if d.Fit.Prefill.Source != "measured" {
		t.Fatalf("prefill curve %+v, want one fitted to the measured prefills", d.Fit.Prefill)
	}
	if got, want := d.Fit.Prefill.Seconds(1024), simPrefill(1024); math.Abs(got-want) > 0.35*want {
		t.Errorf("1,024 tokens priced %.0f ms, want about the engines' %.0f ms", 1000*got, 1000*want)
	}
	// The engines' curve prefills 741 tokens in 250 ms; the quadratic
	// fitted to it (in relative error, the chat mix's short prompts
	// weighing as much as its long ones) a little more.
	if l := pl.thresholds(d.Fit).limit; l > 900 {
		t.Fatalf("prompts up to %d tokens may be prefilled locally, want under 900 (the engines prefill 741 within 250 ms)", l)
	}
}

// TestPrefillCurveIsTheUncontendedCost: on busy engines a prompt shares
// its steps with others and its measured prefill takes up to four times
// its own cost; the curve is the cost alone (the queueing model adds the
// waiting), not the mean of the measurements.
func TestPrefillCurveIsTheUncontendedCost(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	pl := newPlanner(t, Config{Engines: 4})
	curve := PrefillCurve{A: 0.004, B: 1e-4, C: 2e-7}
	for range 120 {
		n := 16 + rng.IntN(1000)
		sec := curve.Seconds(float64(n))
		if rng.IntN(2) == 0 {
			sec *= 1 + 3*rng.Float64()
		}
		pl.ObservePrefill(PrefillSample{At: t0, Tokens: n, Seconds: sec})
	}
	c := pl.prefillCurve(t0.Add(-time.Second), 0)
	for _, n := range []int{128, 512, 1000} {
		if got, want := c.Seconds(float64(n)), curve.Seconds(float64(n)); math.Abs(got-want) > 0.1*want {
			t.Errorf("%d tokens priced %.1f ms, want about the uncontended %.1f ms (curve %+v)", n, 1000*got, 1000*want, c)
		}
	}
}
