package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// chatPrompts and chatOutputs are the P/D experiment's chat workload at
// seed 1 (`tandem bench experiment pd --workloads chat --requests 60 --seed
// 1`): its 60 prompts' tokens and their answers' in the order sent, each
// level and round the same. Its arrivals are one draw of Poisson gaps
// scaled by the level's rate: 59 gaps spanning 5.57 s at 10 req/s, a
// Poisson rate of 1.06λ.
var (
	chatPrompts = []int{87, 95, 89, 197, 153, 637, 219, 68, 256, 87, 261, 62, 69, 111, 257, 123, 846, 203, 131, 488,
		40, 183, 74, 99, 9, 569, 612, 63, 8, 1024, 298, 51, 217, 103, 551, 36, 49, 57, 46, 193, 372, 153, 486, 27, 107,
		791, 286, 74, 37, 32, 85, 16, 341, 100, 280, 91, 21, 33, 407, 96}
	chatOutputs = []int{390, 152, 44, 151, 142, 32, 273, 189, 91, 512, 69, 390, 162, 401, 512, 83, 67, 67, 29, 444, 95,
		183, 69, 512, 191, 139, 126, 77, 512, 20, 359, 512, 80, 255, 512, 380, 222, 328, 444, 195, 40, 109, 512, 466,
		128, 52, 368, 37, 222, 153, 252, 398, 119, 403, 91, 181, 111, 298, 28, 247}
)

// chatLevelsPlanner is the chat workload's balanced cell at four engines
// (TTFT 250 ms, TPOT 25 ms, window 3 s, --max-num-batched-tokens 512) half
// a second into its 40 req/s level, the split at p prefill engines: the 10
// and 20 req/s levels of 60 requests, each drained, then the 40 req/s
// level's first half second. Prefills on the simulated engines' curve,
// decode steps of 1.5 + 0.5·k ms (chatEngines).
func chatLevelsPlanner(t *testing.T, p int) (*Planner, time.Time) {
	t.Helper()
	pl := newPlanner(t, Config{TTFT: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: p,
		MaxBatchedTokens: 512, Window: 3 * time.Second, MinDwell: time.Minute})
	rng := rand.New(rand.NewPCG(26, 14))
	level := func(start time.Time, rate float64, n int) time.Time {
		for i := range n {
			at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			l := chatPrompts[i%len(chatPrompts)]
			pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: chatOutputs[i%len(chatOutputs)]})
			pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: simPrefill(l)})
		}
		return start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
	}
	at := level(t0, 10, 60)
	at = level(at.Add(2*time.Second), 20, 60)
	at = at.Add(2 * time.Second)
	level(at, 40, 20)
	now := at.Add(500 * time.Millisecond)
	for i := range 12 {
		chatEngines(pl, rng, now.Add(-time.Duration(i)*250*time.Millisecond), 4, p, i)
	}
	pl.lastChange = now
	return pl, now
}

// TestChatBurstPredictsTheMeasuredLevels holds the model's attainment on
// the chat balanced cell's levels against what the P/D experiment measured
// for the static splits there (the SLO grid's three rounds, 180 requests
// a level, at 10 / 20 / 40 / 80 req/s: colocated 93 / 93 / 84 / 61%,
// conditional-2p2d 95 / 95 / 87 / 78%, conditional-1p3d 92 / 83 / 77 /
// 76%), each level within 0.2.
func TestChatBurstPredictsTheMeasuredLevels(t *testing.T) {
	measured := map[int][]float64{0: {0.93, 0.93, 0.84, 0.61}, 1: {0.92, 0.83, 0.77, 0.76}, 2: {0.95, 0.95, 0.87, 0.78}}
	rates := []float64{10, 20, 40, 80}
	pl, now := chatLevelsPlanner(t, 2)
	d := pl.Decide(now)
	t.Logf("burst %d, dispersion %.2f, splits%s", d.Fit.BurstRequests, d.Fit.ArrivalDispersion, splitsOf(d))
	for p := 0; p <= 2; p++ {
		th := colocatedThreshold
		if p > 0 {
			th = 256 // conditional's
		}
		m := pl.model(d.Fit, th)
		var got []string
		for i, r := range rates {
			a := m.attainment(p, 4-p, r*1.06)
			got = append(got, fmt.Sprintf("%.2f (r %.2f l %.2f t %.2f)", a.met, a.remoteMiss, a.localMiss, a.tpotMiss))
			if math.Abs(a.met-measured[p][i]) > 0.2 {
				t.Errorf("%dP:%dD at %g req/s: predicted %.2f met, measured %.2f", p, 4-p, r, a.met, measured[p][i])
			}
		}
		t.Logf("%dP:%dD predicted %v, measured %.2f", p, 4-p, got, measured[p])
	}
}
