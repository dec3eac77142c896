package planner

import (
	"fmt"
	"testing"
	"time"
)

// TestNoCadenceAtTheColocatedSplit: long prompts (1,024–2,048 tokens,
// TTFT 1.25 s, TPOT 25 ms) on decodes whose inter-token latency, 22 ms,
// is within a fifth of the objective, at the colocated split held there:
// every prompt is local, and the latencies carry their chunks. The
// cadence stays 1 (it was 8, and the next decision's latencies, the chunks
// spread, set 1 again).
func TestNoCadenceAtTheColocatedSplit(t *testing.T) {
	for _, p := range []int{0} {
		pl := newPlanner(t, Config{TTFT: 1250 * time.Millisecond, TPOT: 25 * time.Millisecond, Engines: 4, Prefill: p,
			MaxBatchedTokens: 512, Window: 15 * time.Second, Hysteresis: 1000})
		now := t0.Add(15 * time.Second)
		for i := range 60 {
			at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
			l := 1024 + (i*389)%1025
			pl.ObserveRequest(Request{At: at, PromptTokens: l, UncachedTokens: l, OutputTokens: 200})
			pl.ObservePrefill(PrefillSample{At: at, URL: "e0", Tokens: l, Seconds: simPrefill(l)})
		}
		for i := range 30 {
			s := now.Add(-time.Duration(i) * 500 * time.Millisecond)
			for e := range 4 {
				es := EngineSample{At: s, URL: fmt.Sprint("e", e), PrefillSecondsPerToken: 0.00035, TransferSecondsPerToken: 2e-6}
				if e >= p {
					k := float64(6 + (i+e)%5)
					es.Decode, es.Running, es.ITLSeconds = true, k, (18+0.5*k)/1000
				}
				pl.ObserveEngine(es)
			}
		}
		d := pl.Decide(now)
		t.Logf("%dP:%dD (now %dP): cadence %d, step %.1f ms at the mean batch %.1f, held %q", p, 4-p, d.Prefill, d.PrefillScheduleInterval, 1000*d.Fit.stepSeconds(), d.Fit.MeanBatch, d.Held)
		if p == 0 && d.PrefillScheduleInterval != 1 {
			t.Errorf("colocated: cadence %d, want 1", d.PrefillScheduleInterval)
		}
		if d.Prefill != p {
			t.Fatalf("the split moved to %dP: the case shows nothing", d.Prefill)
		}
	}
}
