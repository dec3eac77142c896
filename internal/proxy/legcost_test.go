package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestParseEngineTiming(t *testing.T) {
	h := http.Header{}
	h.Add("Server-Timing", "api;dur=0.310, queue;dur=1.5, kv_pull;dur=35.871, kv_ready;dur=0.412")
	h.Add("Server-Timing", `prefill;desc="x";dur=12.5, other;dur=bad, broken`)
	got := parseEngineTiming(h)
	want := engineTiming{queue: 1500 * time.Microsecond, pull: 35871 * time.Microsecond, ready: 412 * time.Microsecond, prefill: 12500 * time.Microsecond, ok: true}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if parseEngineTiming(http.Header{"Server-Timing": {"api;dur=1"}}).ok {
		t.Error("ok without a prefill entry")
	}
	for _, bad := range []string{"NaN", "Inf", "-Inf", "1e300", "3600001", "-1"} {
		if got := parseEngineTiming(http.Header{"Server-Timing": {"prefill;dur=" + bad}}); got.ok {
			t.Errorf("prefill;dur=%s taken as %v", bad, got.prefill)
		}
	}
}

func TestComputedTokensFromUsage(t *testing.T) {
	for _, c := range []struct {
		body string
		n    int
		ok   bool
	}{
		{`{"id":"x","usage":{"prompt_tokens":300,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":96}}}`, 204, true},
		{`{"usage":{"prompt_tokens":300,"prompt_tokens_details":null}}`, 300, true},
		{`{"usage":{"prompt_tokens":300}}`, 300, true},
		{`{"usage":null}`, 0, false},
		{`{"choices":[]}`, 0, false},
		{`data: {"usage":{"prompt_tokens":3}}`, 0, false},
		{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":16}}}`, 0, true},
	} {
		if n, ok := computedTokens([]byte(c.body)); n != c.n || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.body, n, ok, c.n, c.ok)
		}
	}
}

// TestLegCostCurveAndFallback: a few legs price per token; enough of
// enough lengths fit the curve; a leg past legMaxAge leaves the fit.
func TestLegCostCurveAndFallback(t *testing.T) {
	truth := prefillCurve{A: 0.002, B: 0.0002, C: 1e-7}
	lc := &legCost{overlap: 1}
	t0 := time.Unix(1000, 0)
	// Legs one after another: each ends when the next starts.
	at := t0
	leg := func(n int) {
		s := truth.seconds(float64(n))
		at = at.Add(time.Duration(s * float64(time.Second)))
		lc.observe(prefillLeg{at: at, tokens: n, prefill: s})
	}
	leg(100)
	leg(300)
	if e := lc.estimate(); !lc.perTokenOnly || e.curve.A != 0 || e.curve.C != 0 || e.curve.B <= 0 {
		t.Fatalf("two legs: curve %+v (per token only %v), want per token", e.curve, lc.perTokenOnly)
	}
	for i := range 20 {
		leg(64 + 97*i)
	}
	e := lc.estimate()
	if lc.perTokenOnly || !near(e.curve.seconds(1500), truth.seconds(1500), 1e-3) {
		t.Fatalf("curve %+v, want %+v", e.curve, truth)
	}
	if !near(lc.overlap, 1, 1e-6) {
		t.Errorf("overlap %v of legs one after another, want 1", lc.overlap)
	}
	// An old leg is left out of the next fit.
	lc.observe(prefillLeg{at: at.Add(legMaxAge + time.Second), tokens: 500, prefill: 5})
	if e := lc.estimate(); !near(e.curve.seconds(500), 5.0/500*500, 1e-9) || !lc.perTokenOnly {
		t.Errorf("after legMaxAge with one fresh leg: curve %+v, want that leg's per-token cost", e.curve)
	}
}

// TestLegCostPendingIsTheWorkInFlight: the queue estimate is the curve over
// the prefills in flight, times the share of leg time the engine is busy
// (prompts computed side by side each report the whole batch's time).
func TestLegCostPendingIsTheWorkInFlight(t *testing.T) {
	lc := &legCost{overlap: 1}
	t0 := time.Unix(1000, 0)
	// Pairs of legs computed side by side: two of 100 and 300 tokens end
	// together, each 0.1 s, then the next pair.
	for i := range 10 {
		end := t0.Add(time.Duration(i+1) * 100 * time.Millisecond)
		lc.observe(prefillLeg{at: end, tokens: 100 + 40*i, prefill: 0.1})
		lc.observe(prefillLeg{at: end, tokens: 300 + 40*i, prefill: 0.1})
	}
	if !near(lc.overlap, 0.5, 1e-6) {
		t.Errorf("overlap %v, want 0.5 (two prompts per step)", lc.overlap)
	}
	if e := lc.estimate(); e.pending != 0 {
		t.Errorf("pending %v with nothing in flight", e.pending)
	}
	end1 := lc.begin(200)
	end2 := lc.begin(400)
	e := lc.estimate()
	want := 0.5 * (e.curve.seconds(200) + e.curve.seconds(400))
	if !near(e.pending, want, 1e-9) {
		t.Errorf("pending %v, want %v", e.pending, want)
	}
	end1()
	end1() // once
	end2()
	if e := lc.estimate(); !near(e.pending, 0, 1e-9) {
		t.Errorf("pending %v after both ended", e.pending)
	}
}

// TestNeverIdlePrefillEngineGetsALegCost serves clients back to back through
// the P/D path of two simulated engines: the prefill engine has no idle
// moment (the scrape-based cost needs one, or a window whose TTFT and
// queue counts agree), yet its legs price it: a curve of its prefill
// seconds by prompt length, near the simulated cost.
func TestNeverIdlePrefillEngineGetsALegCost(t *testing.T) {
	p, engines, stop := legTraffic(t, "always", 32, 400)
	defer stop()
	checkLegCurve(t, p, engines[0], true)
	// The decode's remote legs prefilled nothing: no curve there.
	if d := p.legs.engine(engines[1]).estimate(); d.curve.measured() {
		t.Errorf("the decode engine, which pulled every prompt, has a prefill curve %+v", d.curve)
	}
	// What the decider sees: the prefill engine's curve, and the decode
	// leg's costs on the decode.
	now := time.Now()
	if e := p.prefill.list()[0].endpoint(now, p.prefill.stale, 0); !e.PrefillCurve.Measured() {
		t.Errorf("the prefill endpoint %+v has no curve", e)
	}
	testutil.WaitFor(t, "the decode legs measured", 10*time.Second, func() bool {
		e := p.decode.list()[0].endpoint(time.Now(), p.decode.stale, 0)
		return e.FirstStepSeconds > 0 && e.PullCurve.Measured()
	})
	e := p.decode.list()[0].endpoint(now, p.decode.stale, 0)
	t.Logf("decode leg: queue %.2f ms, pull %+v (256 tokens: %.2f ms), first step %.2f ms", e.DecodeQueueSeconds*1e3, e.PullCurve, e.PullCurve.Seconds(256)*1e3, e.FirstStepSeconds*1e3)
}

// TestLocalPrefillsPriceTheDecode: prompts below the conditional threshold
// are prefilled by the decode itself, and its answers price it.
func TestLocalPrefillsPriceTheDecode(t *testing.T) {
	p, engines, stop := legTraffic(t, "conditional", 32, 240)
	defer stop()
	checkLegCurve(t, p, engines[1], false)
	if e := p.legs.engine(engines[0]).estimate(); e.curve.measured() {
		t.Errorf("the prefill engine, sent nothing, has a prefill curve %+v", e.curve)
	}
}

// legPerToken is the simulated engines' prefill cost per token in the leg
// tests, legTTFT the fixed part.
const (
	legPerToken = 200 * time.Microsecond
	legTTFT     = 2 * time.Millisecond
)

// legTraffic starts a proxy with decider over a prefill and a decode
// simulated engine, and four clients sending distinct prompts (no prefix
// hits) of lo to hi tokens back to back until stop.
func legTraffic(t *testing.T, decider string, lo, hi int) (p *Proxy, engines []string, stop func()) {
	t.Helper()
	for range 2 {
		cfg := servertest.SimConfig(t, sim.Knobs{TTFT: legTTFT, ITL: 2 * time.Millisecond, PrefillPerToken: legPerToken})
		engines = append(engines, "http://"+servertest.Start(t, cfg).Addr())
	}
	p, err := New(Config{Prefill: engines[:1], Decode: engines[1:], PDDecider: decider, Policy: "round-robin",
		ScrapeInterval: 100 * time.Millisecond, Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	testutil.WaitFor(t, "the proxy ready", 10*time.Second, p.Ready)

	done := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for {
				select {
				case <-done:
					return
				default:
				}
				toks := make([]string, lo+rng.IntN(hi-lo+1))
				for i := range toks {
					toks[i] = fmt.Sprint(1 + rng.IntN(200))
				}
				resp, err := http.Post(url+"/v1/completions", "application/json",
					strings.NewReader(`{"model":"hf","prompt":[`+strings.Join(toks, ",")+`],"max_tokens":4,"ignore_eos":true}`))
				if err != nil {
					t.Errorf("a request failed: %v", err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("a request answered %s: %s", resp.Status, b)
					return
				}
			}
		})
	}
	return p, engines, func() { close(done); wg.Wait(); cancel(); <-served }
}

// checkLegCurve waits for a curve fitted to base's legs and checks it
// against the simulated cost: one prompt alone costs legTTFT + n·legPerToken;
// computed beside at most three others it reports their steps too, so a
// 256-token prompt's latency by the curve is within [alone, 4·alone] (half
// that range's ends for the fit's error). With work, its work (latency ×
// overlap) must also be near its cost alone: on a prefill engine, whose
// steps compute only the legs' prompts.
func checkLegCurve(t *testing.T, p *Proxy, base string, work bool) {
	t.Helper()
	lc := p.legs.engine(base)
	testutil.WaitFor(t, "a prefill curve fitted to "+base+"'s legs", 20*time.Second, func() bool {
		lc.mu.Lock()
		defer lc.mu.Unlock()
		return lc.curve.measured() && !lc.perTokenOnly
	})
	e := lc.estimate()
	alone := (legTTFT + 256*legPerToken).Seconds()
	lc.mu.Lock()
	latency := e.curve.seconds(256)
	overlap := lc.overlap
	lc.mu.Unlock()
	t.Logf("curve %+v, overlap %.2f: a 256-token prompt's latency %.1f ms, work %.1f ms, simulated alone %.1f ms", e.curve, overlap, latency*1e3, latency*overlap*1e3, alone*1e3)
	if latency < alone/2 || latency > 8*alone {
		t.Errorf("a 256-token prompt's latency by the legs %.1f ms, simulated alone %.1f ms (curve %+v)", latency*1e3, alone*1e3, e.curve)
	}
	if w := latency * overlap; work && (w < alone/2 || w > 2*alone) {
		t.Errorf("a 256-token prompt's work by the legs %.1f ms, simulated %.1f ms (curve %+v, overlap %.2f)", w*1e3, alone*1e3, e.curve, overlap)
	}
}

// TestRemoteCostsFitThePull: a pull's fixed part is fitted, not spread over
// its tokens; with few legs, short pulls are priced at their mean, fixed.
func TestRemoteCostsFitThePull(t *testing.T) {
	lc := &legCost{overlap: 1}
	t0 := time.Unix(1000, 0)
	lc.observeRemote(remoteLeg{at: t0, tokens: 7, queue: 0.002, pull: 0.04, first: 0.02})
	lc.observeRemote(remoteLeg{at: t0, tokens: 9, queue: 0.004, pull: 0.04, first: 0.03})
	q, pull, first := lc.remoteCosts()
	if !near(q, 0.003, 1e-9) || !near(first, 0.025, 1e-9) || pull != (prefillCurve{A: 0.04}) {
		t.Errorf("two short legs: queue %v, pull %+v, first %v; want 0.003, a fixed 0.04, 0.025", q, pull, first)
	}
	for i := range 12 {
		n := 64 * (i + 1)
		lc.observeRemote(remoteLeg{at: t0, tokens: n, pull: 0.03 + 1e-5*float64(n)})
	}
	if _, pull, _ := lc.remoteCosts(); !near(pull.seconds(1000), 0.04, 0.05) || pull.A < 0.02 {
		t.Errorf("pull %+v: want about 0.03 + 1e-5·n (0.04 at 1,000 tokens)", pull)
	}
}

// TestShortLegsAloneMeasureNothing: a 7-token prompt's time is mostly its
// step's fixed cost; per token it would price a long prompt at 2.75 ms a
// token where it costs 2. Until a leg of minCostTokens comes, the engine is
// unmeasured by its legs (the scrape's rate prices it).
func TestShortLegsAloneMeasureNothing(t *testing.T) {
	lc := &legCost{overlap: 1}
	t0 := time.Unix(1000, 0)
	lc.observe(prefillLeg{at: t0, tokens: 7, prefill: 0.019})
	if e := lc.estimate(); e.curve.measured() {
		t.Errorf("one 7-token leg: curve %+v, want unmeasured", e.curve)
	}
	lc.observe(prefillLeg{at: t0.Add(time.Second), tokens: 300, prefill: 0.605})
	if e := lc.estimate(); !near(e.curve.B, 0.605/300, 1e-9) || e.curve.A != 0 {
		t.Errorf("with a 300-token leg: curve %+v, want its per-token cost", e.curve)
	}
}
