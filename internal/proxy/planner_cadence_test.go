package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestCadencePathIsTheEngines(t *testing.T) {
	if cadencePath != server.CadencePath {
		t.Errorf("cadencePath = %q, engines serve %q", cadencePath, server.CadencePath)
	}
}

// engineCadence is the prefill cadence the engine at base runs, from its
// admin route.
func engineCadence(t *testing.T, base, key string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+cadencePath, nil)
	setAuth(req.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c server.CadenceResponse
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s%s: %d %v", base, cadencePath, resp.StatusCode, err)
	}
	return c.PrefillScheduleInterval
}

// feedTightTPOT gives the planner a window of short prompts and decode
// samples whose TPOT is near the objective, so that it chooses a prefill
// cadence above 1 for the engines that prefill beside their decodes.
func feedTightTPOT(p *Proxy, now time.Time, prefill, decode []string) {
	p.plan.mu.Lock()
	defer p.plan.mu.Unlock()
	for i := range 40 {
		at := now.Add(time.Duration(i-40) * 250 * time.Millisecond)
		p.plan.pl.ObserveRequest(planner.Request{At: at, PromptTokens: 100, UncachedTokens: 100, OutputTokens: 64})
	}
	for _, u := range prefill {
		p.plan.pl.ObserveEngine(planner.EngineSample{At: now, URL: u, PrefillSecondsPerToken: 0.0002})
	}
	for i, u := range decode {
		k := float64(4 + 2*i)
		p.plan.pl.ObserveEngine(planner.EngineSample{At: now, URL: u, Decode: true, PrefillSecondsPerToken: 0.0002, Running: k, ITLSeconds: (10 + 2*k) / 1000})
	}
}

// TestPlannerSetsTheCadenceOnTheDecodePool runs the acting planner over
// real (simulated) engines started with --prefill-schedule-interval 2: a
// decision held for want of samples changes nothing; a fitted one sets its
// cadence on the decode pool's engines (not the prefill pool's) through
// their authenticated route, once; an engine whose cadence changed behind
// the planner's back, or that joins the decode pool, is set at the next
// decision; GET /tandem/plan reports it all.
func TestPlannerSetsTheCadenceOnTheDecodePool(t *testing.T) {
	const key = "sesame"
	var engines []string
	for range 4 {
		cfg := servertest.SimConfig(t, sim.Knobs{TTFT: time.Millisecond, ITL: time.Millisecond})
		cfg.APIKey, cfg.PrefillScheduleInterval = key, 2
		engines = append(engines, "http://"+servertest.Start(t, cfg).Addr())
	}
	cfg := &planner.Config{TTFT: 2 * time.Second, TPOT: 20 * time.Millisecond, MinRequests: 5, MinThreshold: 256, MaxThreshold: 256}
	p, url := startProxy(t, Config{Prefill: engines[:2], Decode: engines[2:], Planner: cfg, PlannerAct: true, APIKey: key}, nil, nil)
	sets := func() float64 {
		return metricValue(t, p, "tandem:planner_cadence_sets_total", map[string]string{"result": "ok"})
	}
	idle := func() bool { return !p.plan.cad.running.Load() }

	now := time.Now()
	if d := p.planOnce(now); cadenceFitted(d) {
		t.Fatalf("decision %+v fitted without samples", d)
	}
	testutil.WaitFor(t, "no cadence round", 5*time.Second, idle)
	for _, e := range engines {
		if got := engineCadence(t, e, key); got != 2 {
			t.Fatalf("%s runs cadence %d after a decision without samples, want its flag's 2", e, got)
		}
	}

	feedTightTPOT(p, now, engines[:2], engines[2:])
	d := p.planOnce(now)
	if !cadenceFitted(d) || d.PrefillScheduleInterval <= 2 {
		t.Fatalf("decision %+v: want a fitted one with a cadence above 2 (TPOT near its objective)", d)
	}
	want := d.PrefillScheduleInterval
	testutil.WaitFor(t, "the decode pool at the planner's cadence", 10*time.Second, func() bool {
		return idle() && engineCadence(t, engines[2], key) == want && engineCadence(t, engines[3], key) == want
	})
	for _, e := range engines[:2] {
		if got := engineCadence(t, e, key); got != 2 {
			t.Errorf("prefill-pool engine %s runs cadence %d, want its own 2 (the cadence is inert there)", e, got)
		}
	}
	if got := sets(); got != 2 {
		t.Fatalf("%v cadence sets, want 2", got)
	}

	// The same decision again: the engines already run it.
	p.planOnce(now)
	testutil.WaitFor(t, "the round over", 5*time.Second, idle)
	if got := sets(); got != 2 {
		t.Errorf("%v cadence sets after an unchanged decision, want still 2", got)
	}

	// An engine whose cadence changed behind the planner's back (set by
	// hand here; a restart with its flag's does the same) is set again.
	req, _ := http.NewRequest(http.MethodPost, engines[2]+cadencePath, strings.NewReader(`{"prefill_schedule_interval":2}`))
	req.Header.Set("Content-Type", "application/json")
	setAuth(req.Header, key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("setting %s by hand: %v %v", engines[2], resp, err)
	}
	p.planOnce(now)
	testutil.WaitFor(t, "the engine set by hand back at the planner's cadence", 10*time.Second, func() bool {
		return idle() && engineCadence(t, engines[2], key) == want
	})
	if got := sets(); got != 3 {
		t.Errorf("%v cadence sets, want 3: the engine set by hand again, no other", got)
	}

	// An engine moved to the decode pool gets it at the next decision.
	done, err := p.switchRole(context.Background(), p.prefill.list()[0], p.prefill, p.decode)
	if err != nil {
		t.Fatal(err)
	}
	<-done
	moved := p.decode.list()[len(p.decode.list())-1].base
	p.planOnce(now)
	testutil.WaitFor(t, "the moved engine at the planner's cadence", 10*time.Second, func() bool {
		return idle() && engineCadence(t, moved, key) == want
	})

	req, _ = http.NewRequest(http.MethodGet, url+PlanPath, nil)
	setAuth(req.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body planBody
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || body.Cadence == nil || body.Cadence.PrefillScheduleInterval != want || len(body.Cadence.Applied) != 3 || len(body.Cadence.Failed) != 0 {
		t.Fatalf("GET %s: %v %+v, want the cadence %d applied on the 3 decode engines", PlanPath, err, body.Cadence, want)
	}
	for _, u := range append([]string{moved}, engines[2:]...) {
		if body.Cadence.Applied[u] != want {
			t.Errorf("GET %s: %s applied %d, want %d", PlanPath, u, body.Cadence.Applied[u], want)
		}
	}
}

// TestPlannerCadenceRefusedSaysWhy: engines that refuse the call (another
// key) keep their cadence, and /tandem/plan says why and what to do.
func TestPlannerCadenceRefusedSaysWhy(t *testing.T) {
	cfg := servertest.SimConfig(t, sim.Knobs{TTFT: time.Millisecond, ITL: time.Millisecond})
	cfg.APIKey = "engine-key"
	dec := "http://" + servertest.Start(t, cfg).Addr()
	pre := newFake(t, prefillOK)
	p, _ := startProxy(t, Config{Prefill: []string{pre.URL()}, Decode: []string{dec}, Planner: &planner.Config{TTFT: 2 * time.Second, TPOT: 20 * time.Millisecond, MinRequests: 5, MinThreshold: 256, MaxThreshold: 256},
		PlannerAct: true, Fallback: true, BackendAPIKey: "other-key"}, nil, nil)
	now := time.Now()
	feedTightTPOT(p, now, []string{pre.URL()}, []string{dec})
	if d := p.planOnce(now); d.PrefillScheduleInterval <= 1 {
		t.Fatalf("decision %+v: want a cadence above 1", d)
	}
	testutil.WaitFor(t, "the refusal recorded", 10*time.Second, func() bool {
		r := p.cadenceReport()
		return !p.plan.cad.running.Load() && r.Failed[dec] != ""
	})
	if why := p.cadenceReport().Failed[dec]; !strings.Contains(why, "401") || !strings.Contains(why, "--api-key") {
		t.Errorf("failure %q: want the 401 and what to do", why)
	}
	if got := engineCadence(t, dec, "engine-key"); got != 1 {
		t.Errorf("the engine runs cadence %d, want 1 as it was", got)
	}
	if got := metricValue(t, p, "tandem:planner_cadence_sets_total", map[string]string{"result": "failed"}); got != 1 {
		t.Errorf("%v failed sets, want 1", got)
	}
}

// TestPlannerCadenceFollowsRealTraffic serves real traffic through an
// acting planner over simulated engines whose decode steps take about the
// TPOT objective: the planner measures it from their scrapes, chooses a
// cadence above 1 for the prompts the decode engine prefills itself, and
// the decode engine runs it.
func TestPlannerCadenceFollowsRealTraffic(t *testing.T) {
	var engines []string
	for range 2 {
		cfg := servertest.SimConfig(t, sim.Knobs{TTFT: time.Millisecond, ITL: 5 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond})
		engines = append(engines, "http://"+servertest.Start(t, cfg).Addr())
	}
	// The short prompts below are prefilled on the decode engine; the
	// prefill engine stays (MinPrefill), since at the colocated split the
	// planner chooses no cadence.
	plan := &planner.Config{TTFT: 2 * time.Second, TPOT: 5 * time.Millisecond, MinRequests: 10, MaxAge: 5 * time.Second,
		MinThreshold: 256, MaxThreshold: 256, MinPrefill: 1}
	p, err := New(Config{Prefill: engines[:1], Decode: engines[1:], PDDecider: "conditional", Planner: plan, PlannerAct: true,
		PlanInterval: 200 * time.Millisecond, ScrapeInterval: 100 * time.Millisecond, Timeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler)})
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
	defer func() { cancel(); <-served }()
	url := "http://" + ln.Addr().String()
	testutil.WaitFor(t, "the proxy ready", 10*time.Second, p.Ready)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post(url+"/v1/completions", "application/json",
					strings.NewReader(`{"model":"hf","prompt":[1,20,30,40,50,60,70,80],"max_tokens":24,"ignore_eos":true}`))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				if err != nil && failed.Add(1) == 1 {
					t.Errorf("a request failed: %v", err)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	deadline := time.Now().Add(20 * time.Second)
	for engineCadence(t, engines[1], "") <= 1 {
		if time.Now().After(deadline) {
			p.plan.mu.Lock()
			last := p.plan.last
			p.plan.mu.Unlock()
			t.Fatalf("the decode engine still runs cadence 1 after 20 s of traffic; the planner's last decision: %+v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.plan.mu.Lock()
	d := *p.plan.last
	p.plan.mu.Unlock()
	// The planner keeps deciding under the traffic: a new choice reaches
	// the engine a moment after it is made, so the two must agree soon,
	// not at one instant.
	var got, want int
	deadline = time.Now().Add(10 * time.Second)
	for got, want = engineCadence(t, engines[1], ""), int(p.plan.cad.want.Load()); got != want; got, want = engineCadence(t, engines[1], ""), int(p.plan.cad.want.Load()) {
		if time.Now().After(deadline) {
			t.Fatalf("the decode engine runs cadence %d, the planner chose %d (for 10 s)", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The planner may have moved the prefill engine into the decode pool
	// (the colocated split): then it runs the decode pool's cadence;
	// while in the prefill pool it is left as it started. Its cadence is
	// read before its pool: a move in between leaves it out of the
	// prefill pool, and the check out.
	cad0 := engineCadence(t, engines[0], "")
	if !slices.Contains(urlsOf(p.prefill), engines[0]) && !slices.Contains(urlsOf(p.decode), engines[0]) {
		t.Fatalf("engine %s is in neither pool: %v, %v", engines[0], urlsOf(p.prefill), urlsOf(p.decode))
	}
	if slices.Contains(urlsOf(p.prefill), engines[0]) && cad0 != 1 {
		t.Errorf("the prefill engine runs cadence %d, want 1 as it started", cad0)
	}
	t.Logf("cadence %d from TPOT %.1f + %.2f·k ms at mean batch %.1f", d.PrefillScheduleInterval, d.Fit.StepA, d.Fit.StepB, d.Fit.MeanBatch)
}
