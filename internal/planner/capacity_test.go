package planner

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// modelOf is pl's model at threshold th of a window of reqs and the fit f.
func modelOf(pl *Planner, f Fit, th int, reqs []Request) *capacity {
	pl.win = reqs
	return pl.model(f, th)
}

// steady is n requests of prompt tokens (all uncached) and output tokens.
func steady(n, prompt, output int) []Request {
	var rs []Request
	for i := range n {
		rs = append(rs, Request{At: t0.Add(time.Duration(i) * time.Millisecond), PromptTokens: prompt, UncachedTokens: prompt, OutputTokens: output})
	}
	return rs
}

// TestRemoteTTFTCountsTheDecodeLeg: a remote prompt's first token comes
// from its decode, after the KV arrives: it waits for the step under way
// and runs its own. Prompts whose prefill alone fits the TTFT objective
// (80 ms of 110) but not with the decode's 22-ms steps (33 ms more at the
// least) miss it remote, so a split that sends them all there serves none
// within the objectives.
func TestRemoteTTFTCountsTheDecodeLeg(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 110 * time.Millisecond, TPOT: time.Second, Engines: 4})
	f := Fit{PrefillSecondsPerToken: 0.0002, StepA: 20, StepB: 2, MeanBatch: 1, MeanOutput: 32, MaxBatchedTokens: 2048}
	m := modelOf(pl, f, 16, steady(100, 400, 32))
	if leg := m.decodeLeg(0, 1); math.Abs(leg-0.033) > 1e-9 {
		t.Fatalf("decode leg at no load %.4f s, want 1.5 steps of 22 ms", leg)
	}
	if s := m.split(2, 2); s.Goodput != 0 {
		t.Fatalf("2P:2D with every prompt remote predicts %+v, want nothing within a 110-ms TTFT (80 ms prefill + 33 ms decode leg)", s)
	}
	// Kept local, the same prompts meet it (80 ms prefill and one step,
	// 102 ms).
	if s := modelOf(pl, f, colocatedThreshold, steady(100, 400, 32)).split(0, 4); s.Goodput <= 0 {
		t.Fatalf("colocated predicts %+v, want some goodput", s)
	}
}

// TestAttainmentIsTheRequests: the goal is the requests' (both objectives
// met by Config.Goal of them), not each pool's. A tenth of the prompts are
// long and remote (100 ms of prefill against a 150-ms TTFT), the rest
// short and local, meeting it easily. Held to the goal's square root on
// its own prompts, the prefill engine could run only 13% busy; counted
// among all the requests, the long prompts may wait much longer, and the
// split serves several times more.
func TestAttainmentIsTheRequests(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: 150 * time.Millisecond, TPOT: time.Second, Engines: 4, Goal: 0.9})
	f := Fit{PrefillSecondsPerToken: 0.0001, StepA: 1, StepB: 0.1, MeanBatch: 1, MeanOutput: 8, MaxBatchedTokens: 2048}
	reqs := steady(90, 40, 8)
	reqs = append(reqs, steady(10, 1000, 8)...)
	m := modelOf(pl, f, 256, reqs)
	// The per-pool target: the prefill engine's utilisation at which
	// √0.9 of the long prompts (all remote) meet the TTFT objective.
	services := []float64{0.1}
	rho, _ := PrefillBusy(services, 0.1, 1, 0, 0, 0.15-m.decodeLeg(0, 1), math.Sqrt(0.9))
	perPool := rho / 0.1 / 0.1 // long prompts/s over their share of the requests
	s := m.split(1, 3)
	if s.Goodput < 3*perPool {
		t.Fatalf("1P:3D predicts %+v, want several times the per-pool target's %.1f req/s", s, perPool)
	}
	// At the predicted goodput the requests meet the goal, no more.
	if a := m.attainment(1, 3, s.Goodput); math.Abs(a.met-0.9) > 0.01 && s.Limit != "prefill" {
		t.Fatalf("at %.1f req/s %.3f of the requests meet both objectives, want the goal 0.9", s.Goodput, a.met)
	}
	t.Logf("1P:3D %+v, per-pool target %.1f req/s", s, perPool)
}

// TestChatSplitKeepsShortPromptsLocal is the balanced chat cell of the P/D
// experiment (TTFT 250 ms, TPOT 25 ms, four engines, the chat mix, the
// simulated engines' prefill curve measured from their prefills): with a
// prefill pool, the threshold keeps the short prompts local. Priced per
// token, with no decode leg and a per-pool target, the model preferred
// every prompt remote (threshold 16) at 2P:2D and 1P:3D.
func TestChatSplitKeepsShortPromptsLocal(t *testing.T) {
	for _, p := range []int{1, 2} {
		pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: p, MinPrefill: 1,
			MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Minute})
		rng := rand.New(rand.NewPCG(5, 6))
		now := t0.Add(3 * time.Second)
		chatMix(pl, rng, t0, now, 20)
		for i := range 6 {
			chatEngines(pl, rng, t0.Add(time.Duration(i+1)*500*time.Millisecond), 4, p, i)
		}
		for _, r := range pl.reqs {
			pl.ObservePrefill(PrefillSample{At: r.At, URL: "e0", Tokens: r.UncachedTokens, Seconds: simPrefill(r.UncachedTokens)})
		}
		pl.lastChange = now // the dwell holds the split: the threshold is for this one
		d := pl.Decide(now)
		if d.Prefill != p || d.Threshold < 100 {
			t.Errorf("%dP:%dD: threshold %d (best %+v), want the short prompts (~100 tokens and under) local", d.Prefill, d.Decode, d.Threshold, d.Best)
		}
		t.Logf("%dP:%dD threshold %d, %.1f req/s; best %+v", d.Prefill, d.Decode, d.Threshold, d.Fit.Current.Goodput, d.Best)
	}
}
