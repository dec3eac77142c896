package priced

import (
	"math"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
)

// Both engines prefill 10,000 tokens/s and the decode pulls KV at
// 100,000 tokens/s, unless a case changes them.
const (
	sTok = 1e-4
	xTok = 1e-5
)

func decodeEP() router.Endpoint {
	// InFlight 1: the request being decided.
	return router.Endpoint{Role: "decode", Scraped: true, InFlight: 1, PrefillSecondsPerToken: sTok, TransferSecondsPerToken: xTok}
}

func prefillEP() router.Endpoint {
	return router.Endpoint{Role: "prefill", Scraped: true, PrefillSecondsPerToken: sTok}
}

func input(prompt int, dec router.Endpoint, pre ...router.Endpoint) router.DecideInput {
	return router.DecideInput{
		Req:    &router.Request{PromptTokens: prompt, BlockSize: 16, MaxTokens: 64},
		Decode: dec, PrefillHealthy: len(pre), PrefillFree: len(pre), Prefill: pre,
	}
}

func TestDecide(t *testing.T) {
	type change func(in *router.DecideInput)
	running := func(n int64) change { return func(in *router.DecideInput) { in.Decode.InFlight = n + 1 } }
	tests := []struct {
		name    string
		prompt  int
		changes []change
		remote  bool
		reason  string
		local   float64 // want LocalTTFT (s), when priced
		rem     float64 // want RemoteTTFT (s), when priced
	}{
		{"an idle decode prefills itself: no transfer", 1000, nil, false, Cheaper, 0.1, 0.11},
		{"a decode with running streams sends the prompt away", 1000, []change{running(8)}, true, Cheaper, 0.1, 0.11},
		{"one running stream: local 0.2 stream-seconds against remote 0.11", 1000, []change{running(1)}, true, Cheaper, 0.1, 0.11},
		{"the prefill's in-flight prompts push the remote TTFT past the objective", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Prefill[0].InFlightTokens = 50_000 }}, false, WithinSLO, 0.1, 5.11},
		{"the prefill's measured queue does too", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Prefill[0].Waiting, in.Prefill[0].QueueSeconds = 3, 4 }}, false, WithinSLO, 0.1, 4.11},
		{"local prefills the decode has not answered yet delay the local path only", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Decode.LocalPrefillTokens = 5000 }}, true, Cheaper, 0.6, 0.11},
		{"an idle decode's unanswered local prefills push the local path past the objective", 1000,
			[]change{func(in *router.DecideInput) { in.Decode.LocalPrefillTokens = 20_000 }}, true, WithinSLO, 2.1, 0.11},
		{"a queued decode delays both paths alike", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Decode.Waiting, in.Decode.QueueSeconds = 2, 0.5 }}, true, Cheaper, 0.6, 0.61},
		{"a prefix the decode holds leaves little to compute", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Decode.PrefixBlocks = 60 }}, false, Cheaper, 0.004, 0.1004},
		{"a slow side channel makes recomputing cheaper", 1000,
			[]change{running(1), func(in *router.DecideInput) { in.Decode.TransferSecondsPerToken = 5e-4 }}, false, Cheaper, 0.1, 0.6},
		{"a decode too slow for the objective sends it away", 1000,
			[]change{func(in *router.DecideInput) { in.Decode.PrefillSecondsPerToken = 3e-3 }}, true, WithinSLO, 3, 0.11},
		{"neither within the objective: the sooner", 30_000, []change{running(8)}, false, Sooner, 3, 3.3},
		{"an unmeasured prefill is priced at the decode's rate", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Prefill[0].PrefillSecondsPerToken = 0 }}, true, Cheaper, 0.1, 0.11},
		{"an unmeasured decode is priced at the prefill's rate", 1000,
			[]change{running(8), func(in *router.DecideInput) {
				in.Decode.PrefillSecondsPerToken = 0
				in.Prefill[0].PrefillSecondsPerToken = 2e-4
			}},
			true, Cheaper, 0.2, 0.21},
		{"the cheaper of two prefill engines is priced", 1000,
			[]change{running(8), func(in *router.DecideInput) {
				in.Prefill[0].InFlightTokens = 50_000
				in.Prefill = append(in.Prefill, prefillEP())
				in.PrefillHealthy, in.PrefillFree = 2, 2
			}}, true, Cheaper, 0.1, 0.11},

		{"long answers: eight streams' stall is a small share of their TPOT budget, the prefill's queue is not", 1000,
			[]change{running(8), func(in *router.DecideInput) {
				in.Req.MaxTokens = 256
				in.Prefill[0].InFlightTokens = 2000
			}}, false, Cheaper, 0.1, 0.31},
		{"the prefill's queue within the objective but not its margin: local", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Prefill[0].InFlightTokens = 15_000 }}, false, Margin, 0.1, 1.61},
		{"a local prefill would stall the streams past the TPOT objective: remote", 2000,
			[]change{running(1), func(in *router.DecideInput) {
				in.Req.MaxTokens = 4
				in.Decode.TransferSecondsPerToken = 5e-4
			}}, true, Stall, 0.2, 1.2},
		{"no stream to stall: local", 2000,
			[]change{func(in *router.DecideInput) {
				in.Req.MaxTokens = 4
				in.Decode.TransferSecondsPerToken = 5e-4
			}}, false, Cheaper, 0.2, 1.2},

		{"stale decode metrics: the static threshold, long", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.Decode.Scraped = false }}, true, Unpriced + conditional.LongUncached, 0, 0},
		{"stale prefill metrics: the static threshold, short", 100,
			[]change{running(8), func(in *router.DecideInput) { in.Prefill[0].Scraped = false }}, false, Unpriced + conditional.ShortUncached, 0, 0},
		{"no rate measured yet: the static threshold", 1000,
			[]change{func(in *router.DecideInput) {
				in.Decode.PrefillSecondsPerToken, in.Prefill[0].PrefillSecondsPerToken = 0, 0
			}},
			true, Unpriced + conditional.LongUncached, 0, 0},
		{"every prefill saturated: local, as the static decider says", 1000,
			[]change{running(8), func(in *router.DecideInput) { in.PrefillFree, in.Prefill = 0, nil }}, false, conditional.PrefillSaturated, 0, 0},
	}
	d := &Decider{Static: conditional.Decider{}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input(tt.prompt, decodeEP(), prefillEP())
			for _, c := range tt.changes {
				c(&in)
			}
			got := d.Decide(in)
			if got.Remote != tt.remote || got.Reason != tt.reason {
				t.Errorf("Decide = %+v, want remote=%v reason=%s", got, tt.remote, tt.reason)
			}
			p, ok := Estimate(in)
			if priced := tt.reason == Cheaper || tt.reason == WithinSLO || tt.reason == Sooner || tt.reason == Margin || tt.reason == Stall; ok != priced {
				t.Fatalf("Estimate ok=%v, want %v", ok, priced)
			}
			if ok && (!near(p.LocalTTFT, tt.local) || !near(p.RemoteTTFT, tt.rem)) {
				t.Errorf("Estimate = local %.4fs remote %.4fs, want %.4fs and %.4fs (%+v)", p.LocalTTFT, p.RemoteTTFT, tt.local, tt.rem, p)
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9+1e-6*math.Abs(b) }

func TestMustRemoteAndKVPressureApplyBeforeThePrice(t *testing.T) {
	d := &Decider{Static: conditional.Decider{MustRemote: 500, DecodeKVPressure: 0.9}}
	in := input(1000, decodeEP(), prefillEP())
	if got := d.Decide(in); !got.Remote || got.Reason != conditional.MustRemote {
		t.Errorf("a prompt past MustRemote: %+v, want remote must_remote", got)
	}
	in = input(100, decodeEP(), prefillEP())
	in.Decode.KVUsage = 0.95
	if got := d.Decide(in); !got.Remote || got.Reason != conditional.DecodeKVPressure {
		t.Errorf("a decode under KV pressure: %+v, want remote decode_kv_pressure", got)
	}
}

func TestTheObjectiveDecidesWhatIsWithinIt(t *testing.T) {
	// Local 1.5 s, remote 1 s, no running streams.
	in := input(1000, decodeEP(), prefillEP())
	in.Decode.PrefillSecondsPerToken, in.Prefill[0].PrefillSecondsPerToken, in.Decode.TransferSecondsPerToken = 1.5e-3, 1e-3, 0
	for _, tt := range []struct {
		slo    time.Duration
		remote bool
		reason string
	}{
		{2 * time.Second, true, Cheaper},           // both within: remote is cheaper
		{1200 * time.Millisecond, true, WithinSLO}, // only remote is within
		{500 * time.Millisecond, true, Sooner},     // neither: remote is sooner
		{0, true, Cheaper},                         // the default, 2 s
	} {
		got := (&Decider{TTFTObjective: tt.slo}).Decide(in)
		if got.Remote != tt.remote || got.Reason != tt.reason {
			t.Errorf("objective %v: %+v, want remote=%v reason=%s", tt.slo, got, tt.remote, tt.reason)
		}
	}
}

func TestTheMarginGrowsWithTheQueue(t *testing.T) {
	for _, tt := range []struct {
		ttft, queue, want float64
	}{
		{1, 0, 1.2},         // compute alone: its rate error
		{1, 1, 1.5},         // a queue alone: its error
		{2, 1, 2.7},         // both
		{0.5, 1, 1.0},       // a queue estimate above the TTFT: no negative compute
		{0, 0, 0},           // nothing
		{3, 2.5, 4.35},      // a long queue: the margin is mostly its error
		{0.1, 0, 0.12},      // short compute, short margin
		{10, 0, 12},         // long compute, long margin
		{1.61, 1.5, 2.3820}, // the table's margin case
	} {
		if got := Upper(tt.ttft, tt.queue); !near(got, tt.want) {
			t.Errorf("Upper(%v, %v) = %v, want %v", tt.ttft, tt.queue, got, tt.want)
		}
	}
}

func TestTheTPOTObjectiveBoundsTheStall(t *testing.T) {
	if got := StallBudget(64, 0.1); !near(got, 3.15) {
		t.Errorf("StallBudget(64, 100ms) = %v, want 3.15", got)
	}
	if got := StallBudget(0, 0.1); !near(got, 0.05) {
		t.Errorf("StallBudget(0, 100ms) = %v, want 0.05 (one step's)", got)
	}
	// Local 0.2 s stalling one stream of 4 tokens; remote 1.2 s.
	in := input(2000, decodeEP(), prefillEP())
	in.Decode.InFlight, in.Req.MaxTokens, in.Decode.TransferSecondsPerToken = 2, 4, 5e-4
	for _, tt := range []struct {
		tpot   time.Duration
		remote bool
		reason string
	}{
		{0, true, Stall},                         // the default, 100 ms: 0.15 s a stall
		{100 * time.Millisecond, true, Stall},    // the same
		{200 * time.Millisecond, false, Cheaper}, // 0.3 s a stall: local costs 0.4 s, remote 1.2 s
	} {
		got := (&Decider{TPOTObjective: tt.tpot}).Decide(in)
		if got.Remote != tt.remote || got.Reason != tt.reason {
			t.Errorf("TPOT objective %v: %+v, want remote=%v reason=%s", tt.tpot, got, tt.remote, tt.reason)
		}
	}
}

// TestLegMeasuredCosts: the proxy's leg measurements, where it has them,
// price both paths: the engines' prefill curves (not per token), the
// prefill work in flight as the queues, and the remote path's decode leg
// (its seat, the pull, the first step after it).
func TestLegMeasuredCosts(t *testing.T) {
	curve := router.Curve{A: 0.01, B: 1e-4, C: 1e-7} // 1,000 tokens: 0.21 s
	for _, tt := range []struct {
		name                  string
		change                func(in *router.DecideInput)
		local, remote, lq, rq float64
	}{
		{"per token, nothing from the legs", func(in *router.DecideInput) {}, 0.1, 0.11, 0, 0},
		{"the prefill's curve prices the remote prefill", func(in *router.DecideInput) {
			in.Prefill[0].PrefillCurve = curve
		}, 0.1, 0.22, 0, 0},
		{"the prefill's leg work in flight is its queue", func(in *router.DecideInput) {
			in.Prefill[0].PrefillCurve, in.Prefill[0].PrefillQueueSeconds = curve, 0.5
			in.Prefill[0].InFlightTokens = 100 // the per-token queue would be 0.01
		}, 0.1, 0.72, 0, 0.5},
		{"the decode leg: seat, pull, first step", func(in *router.DecideInput) {
			in.Decode.DecodeQueueSeconds, in.Decode.PullCurve, in.Decode.FirstStepSeconds = 0.05, router.Curve{B: 2e-5}, 0.02
		}, 0.15, 0.19, 0.05, 0.05},
		{"no first step measured: the decode's ITL", func(in *router.DecideInput) {
			in.Decode.ITLSeconds = 0.03
		}, 0.1, 0.14, 0, 0},
		{"the decode's curve prices the local prefill, its local work in flight its queue", func(in *router.DecideInput) {
			in.Decode.PrefillCurve, in.Decode.PrefillQueueSeconds = curve, 0.3
			in.Decode.LocalPrefillTokens = 100
		}, 0.51, 0.11, 0.3, 0},
		{"an unmeasured decode is priced at the prefill's curve", func(in *router.DecideInput) {
			in.Decode.PrefillSecondsPerToken, in.Prefill[0].PrefillCurve = 0, curve
			in.Decode.LocalPrefillTokens = 100 // one prompt of 100 tokens at the curve
		}, 0.21 + 0.021, 0.22, 0.021, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := input(1000, decodeEP(), prefillEP())
			tt.change(&in)
			p, ok := Estimate(in)
			if !ok || !near(p.LocalTTFT, tt.local) || !near(p.RemoteTTFT, tt.remote) || !near(p.LocalQueue, tt.lq) || !near(p.RemoteQueue, tt.rq) {
				t.Errorf("Estimate = %+v ok=%v, want local %.4f (queue %.4f), remote %.4f (queue %.4f)", p, ok, tt.local, tt.lq, tt.remote, tt.rq)
			}
		})
	}
}

func TestLocalCostWeighsTheStallByTheTPOTBudget(t *testing.T) {
	p := Price{LocalTTFT: 0.1, LocalStall: 0.1, Streams: 8, Output: 64}
	// 8 streams × 0.1 s, each 0.1/6.3 of its TPOT budget, at 2 s a budget.
	if got := LocalCost(p, 2, 0.1); !near(got, 0.1+8*0.1*2/6.3) {
		t.Errorf("LocalCost = %v, want %v", got, 0.1+8*0.1*2/6.3)
	}
	p.Streams = 0
	if got := LocalCost(p, 2, 0.1); !near(got, 0.1) {
		t.Errorf("no streams: LocalCost = %v, want the TTFT 0.1", got)
	}
}

// TestColdStartDecidesAsConditional: before any cost is measured (a new
// cluster: no leg answered, no scrape with a rate) or while the metrics are
// stale, the priced decider decides every request as the conditional
// decider at its threshold does, whatever the load, and says so in its
// reason (unpriced_*): a cluster started with the priced default is at
// least the conditional default until it has a price.
func TestColdStartDecidesAsConditional(t *testing.T) {
	cold := func(in *router.DecideInput) {
		in.Decode.PrefillSecondsPerToken, in.Decode.TransferSecondsPerToken = 0, 0
		for i := range in.Prefill {
			in.Prefill[i].PrefillSecondsPerToken = 0
		}
	}
	states := map[string]func(in *router.DecideInput){
		"nothing measured":           cold,
		"the decode's metrics stale": func(in *router.DecideInput) { in.Decode.Scraped = false },
		"every prefill's metrics stale": func(in *router.DecideInput) {
			for i := range in.Prefill {
				in.Prefill[i].Scraped = false
			}
		},
		"nothing measured, a loaded decode": func(in *router.DecideInput) {
			cold(in)
			in.Decode.InFlight, in.Decode.Waiting, in.Decode.QueueSeconds = 9, 3, 0.5
		},
		"nothing measured, a prefix cached": func(in *router.DecideInput) { cold(in); in.Decode.PrefixBlocks = 10 },
	}
	for _, th := range []int{0, 64, 256, 1000} {
		for name, state := range states {
			for _, prompt := range []int{1, 63, 64, 255, 256, 257, 400, 999, 1000, 4096} {
				in := input(prompt, decodeEP(), prefillEP())
				state(&in)
				d := Decider{Static: conditional.Decider{Threshold: th}}
				want := d.Static.Decide(in)
				got := d.Decide(in)
				if got.Remote != want.Remote || got.Reason != Unpriced+want.Reason {
					t.Errorf("%s, threshold %d, prompt %d: %+v, want conditional's %+v as %s", name, th, prompt, got, want, Unpriced+want.Reason)
				}
			}
		}
	}
}

// TestPlannedThresholdPlacesWhatMissesEitherWay: with a planner's threshold
// (Planned), a request neither path serves within the objectives is placed
// by the threshold, as the planner sized the split for it (a long prompt
// sent to the prefill pool, not kept on the decode because it is sooner);
// a request priced within the objectives is decided by its price as
// without it.
func TestPlannedThresholdPlacesWhatMissesEitherWay(t *testing.T) {
	neither := input(30_000, decodeEP(), prefillEP()) // local 3 s, remote 3.3 s: both past 2 s
	neither.Decode.InFlight = 9
	within := input(1000, decodeEP(), prefillEP()) // an idle decode: local 0.1 s, cheaper
	for _, c := range []struct {
		name      string
		in        router.DecideInput
		threshold int
		planned   bool
		remote    bool
		reason    string
	}{
		{"neither within, no planner: the sooner", neither, 256, false, false, Sooner},
		{"neither within, the planner's threshold below the prompt: remote", neither, 256, true, true, Planned + conditional.LongUncached},
		{"neither within, the planner's threshold above the prompt: local", neither, 40_000, true, false, Planned + conditional.ShortUncached},
		{"within the objectives: the price, whatever the threshold", within, 16, true, false, Cheaper},
	} {
		d := Decider{Static: conditional.Decider{Threshold: c.threshold}, Planned: c.planned}
		if got := d.Decide(c.in); got.Remote != c.remote || got.Reason != c.reason {
			t.Errorf("%s: %+v, want remote=%v reason=%s", c.name, got, c.remote, c.reason)
		}
	}
}
