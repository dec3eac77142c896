package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// sharedPrefixRun is what one policy did with the shared-system-prompt
// workload: every answer, and the decode engines' own prefix-cache
// counters (vllm:prefix_cache_hits and _queries, in tokens).
type sharedPrefixRun struct {
	answers       map[string]string
	hits, queries float64
	perDecode     []string // "hits/queries" of each decode
}

func (r sharedPrefixRun) hitRate() float64 {
	if r.queries == 0 {
		return 0
	}
	return r.hits / r.queries
}

// Shared-system-prompt workload: groups of requests sharing a long
// system prompt (about 270 of each prompt's 310 tokens), each with its own
// short question, sent one at a time with the groups interleaved. groups is
// prime to decodes so that round-robin does not by chance keep a group on
// one decode.
const (
	spGroups   = 5
	spRequests = 6 // per group
	spDecodes  = 4
)

func systemPrompt(g int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "System prompt %d. You are a helpful assistant for the team of group %d.", g, g)
	for i := range 5 {
		fmt.Fprintf(&b, " Rule %d of group %d: answer kindly, briefly and with care, like Lily in the park.", i, g)
	}
	return b.String()
}

// runSharedPrefix starts one simulated prefill and decodes simulated
// decodes (`tandem serve --simulate`, in-process) behind a proxy with
// policy, decider and the model's tokenizer, as `tandem up --simulate
// --decode N --policy POLICY --pd-decider DECIDER` runs them, and sends the
// workload. Under the "always" decider every request must take the P/D
// path.
func runSharedPrefix(t *testing.T, policy, decider string, decodes int) sharedPrefixRun {
	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	var decs []string
	for range decodes {
		d, _ := startSimEngine(t, "--role", "decode")
		decs = append(decs, d)
	}
	tok, err := tokenizer.Load(simModelDir)
	if err != nil {
		t.Fatal(err)
	}
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: decs, Policy: policy, PDDecider: decider, Tokenizer: tok, ScrapeInterval: -1})
	waitHealthy(t, url)
	run := sharedPrefixRun{answers: map[string]string{}}
	for r := range spRequests {
		for g := range spGroups {
			prompt := fmt.Sprintf("%s Question %d: what should member %d of the team do today?", systemPrompt(g), r, r)
			body := fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":8,"temperature":0,"ignore_eos":true}`, prompt)
			a := ask(t, url, "/v1/completions", body)
			if a.status != http.StatusOK || (decider == "always" && a.pd != "remote") {
				t.Fatalf("group %d request %d: %d, x-tandem-pd %q: %s", g, r, a.status, a.pd, a.body)
			}
			run.answers[fmt.Sprintf("%d/%d", g, r)] = a.text
		}
	}
	// The counters are updated after each engine step: read them once
	// they stop moving.
	read := func() (h, q float64, each []string) {
		for _, d := range decs {
			dh, dq := testutil.Metric(t, d, "vllm:prefix_cache_hits", ""), testutil.Metric(t, d, "vllm:prefix_cache_queries", "")
			h, q = h+dh, q+dq
			each = append(each, fmt.Sprintf("%.0f/%.0f", dh, dq))
		}
		return h, q, each
	}
	run.hits, run.queries, run.perDecode = read()
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		h, q, each := read()
		if h == run.hits && q == run.queries {
			break
		}
		run.hits, run.queries, run.perDecode = h, q, each
	}
	return run
}

// TestPrefixPolicyHitsTheEnginesPrefixCache measures the prefix-cache hit
// rate the simulated decode engines report themselves, for the
// shared-system-prompt workload, under the prefix policy and under
// round-robin: prefix-aware routing keeps a group on the decode that holds
// its system prompt, round-robin spreads it over all of them. The answers
// are the same under both (docs/performance.md records the rates).
func TestPrefixPolicyHitsTheEnginesPrefixCache(t *testing.T) {
	prefix := runSharedPrefix(t, factory.PolicyPrefix, "always", spDecodes)
	rr := runSharedPrefix(t, factory.PolicyRoundRobin, "always", spDecodes)
	t.Logf("decode prefix-cache hit rate (vllm:prefix_cache_hits / vllm:prefix_cache_queries, %d groups × %d requests over %d decodes): prefix %.1f%% (%.0f/%.0f tokens; per decode %v), round-robin %.1f%% (%.0f/%.0f; per decode %v)",
		spGroups, spRequests, spDecodes, 100*prefix.hitRate(), prefix.hits, prefix.queries, prefix.perDecode, 100*rr.hitRate(), rr.hits, rr.queries, rr.perDecode)
	if prefix.queries == 0 || rr.queries == 0 {
		t.Fatalf("no prefix-cache queries counted (prefix %v, round-robin %v)", prefix.queries, rr.queries)
	}
	// Ideal: prefix misses each group's system prompt once (5/6 of the
	// system prompt tokens hit), round-robin once per decode it visits
	// (2/6 hit).
	if prefix.hitRate() < 0.6 || prefix.hitRate() < 2*rr.hitRate() {
		t.Errorf("prefix policy hit rate %.1f%%, round-robin %.1f%%: want prefix ≥ 60%% and ≥ twice round-robin", 100*prefix.hitRate(), 100*rr.hitRate())
	}
	for k, want := range rr.answers {
		if got := prefix.answers[k]; got != want {
			t.Errorf("request %s: answer %q under the prefix policy, %q under round-robin", k, got, want)
		}
	}
}

// TestDefaultRoutingHitsThePrefixCache is the shared-system-prompt workload
// over one prefill and three decodes as a new user runs it: vLLM's toy
// proxy (round-robin, always disaggregate), the prefix policy alone, and
// the proxy's defaults (proxy.DefaultPolicy, proxy.DefaultPDDecider). The
// defaults keep each group on the decode holding its system prompt, as the
// prefix policy does (docs/usage/routing.md records the ratios).
func TestDefaultRoutingHitsThePrefixCache(t *testing.T) {
	const decodes = 3
	toy := runSharedPrefix(t, factory.PolicyRoundRobin, "always", decodes)
	prefix := runSharedPrefix(t, factory.PolicyPrefix, "always", decodes)
	def := runSharedPrefix(t, proxy.DefaultPolicy, proxy.DefaultPDDecider, decodes)
	t.Logf("decode prefix-cache hit ratio, %d groups × %d requests over 1 prefill and %d decodes: round-robin+always %.2f (%.0f/%.0f tokens), prefix+always %.2f (%.0f/%.0f), defaults %s+%s %.2f (%.0f/%.0f)",
		spGroups, spRequests, decodes, toy.hitRate(), toy.hits, toy.queries, prefix.hitRate(), prefix.hits, prefix.queries,
		proxy.DefaultPolicy, proxy.DefaultPDDecider, def.hitRate(), def.hits, def.queries)
	if def.queries == 0 || toy.queries == 0 {
		t.Fatalf("no prefix-cache queries counted (defaults %v, round-robin %v)", def.queries, toy.queries)
	}
	if def.hitRate() < 0.6 || def.hitRate() < prefix.hitRate()-0.05 || def.hitRate() <= toy.hitRate() {
		t.Errorf("defaults' hit ratio %.2f: want ≥ 0.6, within 0.05 of the prefix policy's %.2f and above round-robin's %.2f", def.hitRate(), prefix.hitRate(), toy.hitRate())
	}
	for k, want := range toy.answers {
		if got := def.answers[k]; got != want {
			t.Errorf("request %s: answer %q under the defaults, %q under round-robin+always", k, got, want)
		}
	}
}
