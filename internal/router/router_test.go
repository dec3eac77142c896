package router_test

import (
	"fmt"
	"testing"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/picker/maxscore"
	"github.com/tandem-serve/tandem/internal/router/picker/p2c"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
)

func endpoints(n int) []router.Endpoint {
	eps := make([]router.Endpoint, n)
	for i := range eps {
		eps[i] = router.Endpoint{Index: i, URL: fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250), Healthy: true, Role: "decode"}
	}
	return eps
}

func TestProfileSkipsUnhealthyAndSaturated(t *testing.T) {
	prof, err := factory.Profile(factory.PolicyLoad, "decode", factory.Options{MaxInFlight: 2})
	if err != nil {
		t.Fatal(err)
	}
	eps := endpoints(3)
	eps[0].Healthy = false
	eps[1].InFlight = 2
	for range 10 {
		i, err := prof.Run(&router.Request{}, eps)
		if err != nil || i != 2 {
			t.Fatalf("Run = %d, %v; want 2 (0 unhealthy, 1 saturated)", i, err)
		}
	}
	eps[2].InFlight = 5
	if _, err := prof.Run(&router.Request{}, eps); err != router.ErrNoCandidate {
		t.Errorf("all saturated: err = %v, want ErrNoCandidate", err)
	}
}

func TestMaxScoreBreaksTiesAtRandom(t *testing.T) {
	got := map[int]int{}
	for range 400 {
		got[maxscore.Picker{}.Pick(nil, endpoints(4), []float64{0.5, 1, 1, 0.2})]++
	}
	if got[0] != 0 || got[3] != 0 || got[1] < 120 || got[2] < 120 {
		t.Errorf("picks %v: want only 1 and 2, about half each", got)
	}
}

func TestPowerOfTwoNeverPicksTheWorst(t *testing.T) {
	for range 200 {
		if i := (p2c.Picker{}).Pick(nil, endpoints(3), []float64{0, 1, 0.5}); i == 0 {
			t.Fatal("picked the worst of three")
		}
	}
}

func TestConditionalDecider(t *testing.T) {
	d := &conditional.Decider{Threshold: 100, MustRemote: 4000, DecodeKVPressure: 0.9}
	tests := []struct {
		name   string
		prompt int
		cached int // blocks of 16
		free   int
		kv     float64
		want   router.Decision
	}{
		{"a short prompt is local", 50, 0, 1, 0, router.Decision{Reason: conditional.ShortUncached}},
		{"a long uncached prompt is remote", 1000, 0, 1, 0, router.Decision{Remote: true, Reason: conditional.LongUncached}},
		{"a long prompt mostly cached is local", 1000, 60, 1, 0, router.Decision{Reason: conditional.ShortUncached}},
		{"a saturated prefill pool keeps it local", 1000, 0, 0, 0, router.Decision{Reason: conditional.PrefillSaturated}},
		{"decode KV pressure sends even short prompts away", 50, 0, 1, 0.95, router.Decision{Remote: true, Reason: conditional.DecodeKVPressure}},
		{"a must-remote prompt goes remote even with the pool saturated", 5000, 0, 0, 0, router.Decision{Remote: true, Reason: conditional.MustRemote}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := router.DecideInput{
				Req:            &router.Request{PromptTokens: tt.prompt, BlockSize: 16},
				Decode:         router.Endpoint{PrefixBlocks: tt.cached, Scraped: tt.kv > 0, KVUsage: tt.kv},
				PrefillHealthy: 1, PrefillFree: tt.free,
			}
			if got := d.Decide(in); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestApproxIndex(t *testing.T) {
	x := prefix.NewApprox(4)
	x.Observe("a", []uint64{1, 2, 3})
	x.Observe("b", []uint64{1, 2})
	got := map[string]int{}
	x.Match([]uint64{1, 2, 3, 4}, func(e string, n int) { got[e] = n })
	if got["a"] != 3 || got["b"] != 2 || len(got) != 2 {
		t.Errorf("Match = %v, want a:3 b:2", got)
	}
	x.Observe("a", []uint64{7, 8}) // capacity 4: block 1 and 2 of a are evicted
	got = map[string]int{}
	x.Match([]uint64{1, 2, 3}, func(e string, n int) { got[e] = n })
	if _, ok := got["a"]; ok || got["b"] != 2 {
		t.Errorf("after eviction Match = %v, want only b:2", got)
	}
	x.Forget("b")
	got = map[string]int{}
	x.Match([]uint64{1}, func(e string, n int) { got[e] = n })
	if len(got) != 0 {
		t.Errorf("after Forget Match = %v, want none", got)
	}
}

// BenchmarkDecision is the pipeline's decision latency per request (filters,
// four scorers, max-score) at 1 to 1000 backends.
func BenchmarkDecision(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			prof, _ := factory.Profile(factory.PolicyPrefix, "decode", factory.Options{MaxInFlight: 1 << 20})
			eps := endpoints(n)
			for i := range eps {
				eps[i].InFlight, eps[i].InFlightTokens, eps[i].Scraped, eps[i].Waiting, eps[i].KVUsage = int64(i%7), int64(i%13)*100, true, float64(i%5), float64(i%10)/10
				eps[i].PrefixBlocks = i % 3
			}
			req := &router.Request{PromptTokens: 512, BlockSize: 16, BlockHashes: make([]uint64, 32)}
			b.ReportAllocs()
			for b.Loop() {
				_, _ = prof.Run(req, eps)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/decision")
		})
	}
}

func TestScorers(t *testing.T) {
	eps := []router.Endpoint{
		{Index: 0, InFlight: 4, InFlightTokens: 1000, Scraped: true, Waiting: 5, Running: 2, KVUsage: 0.9, Host: "a", PrefixBlocks: 4},
		{Index: 1, InFlight: 0, InFlightTokens: 0, Scraped: true, Waiting: 0, Running: 0, KVUsage: 0.1, Host: "b", PrefixBlocks: 1},
		{Index: 2, InFlight: 2, InFlightTokens: 500, Scraped: false, Host: "b"},
	}
	req := &router.Request{BlockHashes: make([]uint64, 4), Near: "b"}
	for _, tt := range []struct {
		name string
		want []float64
	}{
		{"load", []float64{0, 1, 0.5}},
		{"queue", []float64{0, 1, 0.5}},
		{"kv-usage", []float64{0.1, 0.9, 0.5}},
		{"prefix", []float64{1, 0.25, 0}},
		{"same-host", []float64{0, 1, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := factory.Scorer(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float64, len(eps))
			s.Score(req, eps, got)
			for i := range got {
				if d := got[i] - tt.want[i]; d > 1e-9 || d < -1e-9 {
					t.Errorf("scores %v, want %v", got, tt.want)
					break
				}
			}
		})
	}
}

// TestABurstSpreadsOverAStaleScrape replays a burst's start as the P/D
// experiment's 80 req/s level saw it: four decode engines, the last scrape
// (up to 250 ms old) showing engine 0 idle and the others with the
// requests the router had sent them running, and 24 more requests arriving
// before the next scrape, none finished. The prefix policy (2·prefix + load
// + queue + 0.5·kv-usage; no prefix shared) must spread them: without the
// correction the queue scorer kept ranking engine 0 first from the stale
// scrape, against a load scorer that could only tie it, and the level's
// one engine queued 8–20 requests while the others queued 0–5.
func TestABurstSpreadsOverAStaleScrape(t *testing.T) {
	prof, err := factory.Profile(factory.PolicyPrefix, "decode", factory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	scraped := []int64{0, 5, 2, 5} // running at the scrape: the router's own requests
	open := append([]int64(nil), scraped...)
	got := make([]int, 4)
	const burst = 24
	for range burst {
		eps := endpoints(4)
		for i := range eps {
			eps[i].InFlight, eps[i].InFlightTokens = open[i], 300*open[i]
			eps[i].Scraped, eps[i].Running, eps[i].KVUsage = true, float64(scraped[i]), 0.001
			eps[i].SinceScrape = open[i] - scraped[i]
		}
		i, err := prof.Run(&router.Request{}, eps)
		if err != nil {
			t.Fatal(err)
		}
		open[i]++
		got[i]++
	}
	// Balanced, the 36 open requests are 9 an engine: engine 0 takes 9 of
	// the burst, the others 4, 7 and 4. Allow one request of slack for the
	// picker's random tie-break.
	want := []int{9, 4, 7, 4}
	for i := range got {
		if got[i] > want[i]+1 {
			t.Errorf("the burst's %d requests went %v (open %v), want about %v", burst, got, open, want)
			break
		}
	}
}
