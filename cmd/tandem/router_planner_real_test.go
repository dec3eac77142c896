package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// plannerLists is the proxy's pools as GET /tandem/plan lists them.
func plannerLists(t *testing.T, url string) (prefill, decode []string) {
	t.Helper()
	_, plan, err := testutil.GetPlan(t, url+proxy.PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	return plan.Prefill, plan.Decode
}

// TestPlannerRoleSwitchUnderLoadOnRealEngines moves a real engine from the
// prefill pool to the decode pool while requests flow through the P/D path:
// it joins the decode pool at once and serves decode legs (it pulls their
// KV), every request is answered, each answer equals a colocated engine's
// for the same prompt (greedy), its old work ends (the planner lists no
// engine as finishing it) and no engine is left holding KV.
//
// The switch is forced through the planner's bounds: it starts at 2
// prefill + 1 decode with at least 2 decode engines required, so its first
// decision moves one prefill engine; with too few requests to fit it
// decides nothing more.
func TestPlannerRoleSwitchUnderLoadOnRealEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three real engines under load")
	}
	var engines []string
	for range 3 {
		engines = append(engines, startEngine(t, "--kv-port", "0")) // --role both, the default
	}
	colocated := startEngine(t, "--kv-port", "0")
	cfg := &planner.Config{TTFT: time.Minute, TPOT: 10 * time.Second, MinDecode: 2, MinRequests: 1 << 20}
	_, url := startTestProxy(t, proxy.Config{Prefill: engines[:2], Decode: engines[2:], Policy: "round-robin", PDDecider: "always",
		Planner: cfg, PlannerAct: true, PlanInterval: 300 * time.Millisecond})
	waitHealthy(t, url)

	prompt := func(i int) string {
		return fmt.Sprintf(`{"model":"hf","prompt":"%d. Once upon a time, there was a little girl named Lily. She","max_tokens":12,"temperature":0}`, i)
	}
	type answer struct {
		status   int
		pd, text string
	}
	var mu sync.Mutex
	var got []answer
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				st, pd, text := completion(t, url, prompt(i), nil)
				mu.Lock()
				got[i] = answer{st, pd, text}
				mu.Unlock()
			}
		})
	}
	// Requests flow from before the switch until 16 after it was seen.
	deadline := time.Now().Add(30 * time.Second)
	after := -1
	for i := 0; after < 16 && time.Now().Before(deadline); i++ {
		mu.Lock()
		got = append(got, answer{})
		mu.Unlock()
		next <- i
		if after >= 0 {
			after++
		} else if pre, dec, _ := plannerPools(t, url); pre == 1 && dec == 2 {
			after = 0
			t.Logf("the switch was seen after %d requests", i+1)
		}
	}
	close(next)
	wg.Wait()
	if after < 0 {
		pre, dec, d := plannerPools(t, url)
		t.Fatalf("no switch: %d prefill, %d decode, decision %+v", pre, dec, d)
	}
	_, dec := plannerLists(t, url)
	moved := dec[slices.IndexFunc(dec, func(u string) bool { return u != engines[2] })]
	if pulls := testutil.Metric(t, moved, "tandem:kv_transfer_seconds_count", ""); pulls == 0 {
		t.Errorf("the engine moved to the decode pool (%s) pulled no KV: it served no decode leg", moved)
	}
	testutil.WaitFor(t, "the moved engine's old work ended", 30*time.Second, func() bool {
		resp, err := http.Get(url + proxy.PlanPath)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Finishing map[string]string `json:"finishing"`
		}
		return json.NewDecoder(resp.Body).Decode(&body) == nil && len(body.Finishing) == 0
	})
	for i, a := range got {
		if a.status != http.StatusOK {
			t.Fatalf("request %d: %d, x-tandem-pd %q: %s", i, a.status, a.pd, a.text)
		}
		st, _, want := completion(t, colocated, prompt(i), nil)
		if st != http.StatusOK || a.text != want {
			t.Errorf("request %d (x-tandem-pd %q): %q, the colocated engine answers %q", i, a.pd, a.text, want)
		}
	}
	for _, e := range engines {
		if held := testutil.Metric(t, e, "tandem:kv_blocks_held", ""); held != 0 {
			t.Errorf("engine %s still holds %v KV blocks", e, held)
		}
		if exp := testutil.Metric(t, e, "tandem:kv_leases_expired_total", ""); exp != 0 {
			t.Errorf("engine %s let %v leases expire", e, exp)
		}
	}
}
