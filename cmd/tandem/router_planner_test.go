package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
)

// plannerPools asks the proxy's plan route for its pools and decision.
func plannerPools(t *testing.T, url string) (prefill, decode int, d *planner.Decision) {
	t.Helper()
	resp, err := http.Get(url + proxy.PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Decision *planner.Decision `json:"decision"`
		Prefill  []string          `json:"prefill"`
		Decode   []string          `json:"decode"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return len(body.Prefill), len(body.Decode), body.Decision
}

// TestPlannerSplitFollowsAShiftingWorkload runs four simulated engines,
// all serving both roles, behind a proxy whose planner acts, and sends a
// workload that shifts from chat-heavy (short prompts, long answers) to
// long-prompt-heavy (long prompts, short answers) and back. The prefill
// pool empties while chat dominates (the colocated split: every engine
// prefills its own short prompts), grows while long prompts dominate and
// empties again after, each within a bounded time of the shift, and no
// request fails while engines change pools.
func TestPlannerSplitFollowsAShiftingWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs simulated engines for about 20 seconds")
	}
	// A 400-token prompt prefills in 40 ms; a decode step takes 4 ms.
	engine := []string{"--kv-port", "0", "--sim-ttft", "1ms", "--sim-prefill-per-token", "100us", "--sim-itl", "4ms", "--sim-mean-output-len", "0"}
	var urls []string
	for range 4 {
		u, _ := startSimEngine(t, engine...)
		urls = append(urls, u)
	}
	cfg := &planner.Config{
		TTFT: 150 * time.Millisecond, TPOT: 12 * time.Millisecond, MaxSeqs: 8,
		Window: 2 * time.Second, MaxAge: time.Second, MinDwell: 400 * time.Millisecond, MinRequests: 10,
		// Prompts of 128 uncached tokens and more are always prefilled
		// remotely, so long prompts load the prefill pool.
		MaxThreshold: 128,
	}
	_, url := startTestProxy(t, proxy.Config{Prefill: urls[:1], Decode: urls[1:], Policy: "round-robin", PDDecider: "conditional",
		ScrapeInterval: 50 * time.Millisecond, Planner: cfg, PlannerAct: true, PlanInterval: 100 * time.Millisecond, DrainTimeout: 10 * time.Second})
	waitHealthy(t, url)

	// Every prompt starts with its own number: nothing is cached.
	var n atomic.Int64
	chat := func() string {
		return fmt.Sprintf(`{"model":"hf","prompt":"%d. Tell me a story about Lily.","max_tokens":48,"ignore_eos":true}`, n.Add(1))
	}
	long := func() string {
		return fmt.Sprintf(`{"model":"hf","prompt":"%d. %s","max_tokens":2,"ignore_eos":true}`, n.Add(1), strings.Repeat("Lily went to the park to play. ", 30))
	}

	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	// phase sends body from clients closed-loop clients for at least the
	// planner's window, then until cond holds or limit passes, and returns
	// how long cond took from the phase's start (limit when never).
	phase := func(name string, body func() string, clients int, limit time.Duration, cond func(p, d int) bool) time.Duration {
		start := time.Now()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body()))
					if err != nil {
						failed.Add(1)
						firstFailure.CompareAndSwap(nil, err.Error())
						continue
					}
					var r struct {
						Choices []struct{ Text string } `json:"choices"`
					}
					derr := json.NewDecoder(resp.Body).Decode(&r)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || derr != nil || len(r.Choices) != 1 {
						failed.Add(1)
						firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s: status %d, x-tandem-pd %q", name, resp.StatusCode, resp.Header.Get(proxy.HeaderPD)))
					}
				}
			})
		}
		took := limit
		for time.Since(start) < limit {
			if p, d, _ := plannerPools(t, url); cond(p, d) && took == limit {
				took = time.Since(start)
			}
			if took < limit && time.Since(start) >= cfg.Window {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		p, d, dec := plannerPools(t, url)
		if !cond(p, d) {
			took = limit // it did not stay
		}
		if dec != nil {
			t.Logf("%s: after %v: %dP:%dD, best %dP:%dD, threshold %d, remote fraction %.2f, held %q", name, time.Since(start).Round(time.Millisecond),
				p, d, dec.Best.P, dec.Best.D, dec.Threshold, dec.Fit.RemoteFraction, dec.Held)
		}
		return took
	}
	const bound = 15 * time.Second // window + dwell per engine moved + drain, with room for a loaded host
	if took := phase("chat", chat, 6, bound, func(p, d int) bool { return p == 0 }); took >= bound {
		_, _, d := plannerPools(t, url)
		t.Fatalf("chat-heavy: the prefill pool did not empty: %+v", d)
	}
	took := phase("long", long, 6, bound, func(p, d int) bool { return p >= 1 })
	if took >= bound {
		_, _, d := plannerPools(t, url)
		t.Fatalf("long-prompt-heavy: the prefill pool did not grow within %v: decision %+v", bound, d)
	}
	t.Logf("long prompts: the prefill pool grew in %v", took.Round(time.Millisecond))
	took = phase("back to chat", chat, 6, bound, func(p, d int) bool { return p == 0 })
	if took >= bound {
		_, _, d := plannerPools(t, url)
		t.Fatalf("back to chat: the prefill pool did not empty within %v: decision %+v", bound, d)
	}
	t.Logf("back to chat: the prefill pool shrank in %v; %d requests sent", took.Round(time.Millisecond), sent.Load())
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed while engines changed pools; first: %v", n, sent.Load(), firstFailure.Load())
	}
}
