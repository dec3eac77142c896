package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
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

// runSharedPrefix starts one simulated prefill and spDecodes simulated
// decodes (`tandem serve --simulate`, in-process) behind a proxy with
// policy, the model's tokenizer and the default "always" decider, as
// `tandem up --simulate --policy POLICY` runs them, and sends the workload.
func runSharedPrefix(t *testing.T, policy string) sharedPrefixRun {
	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	var decs []string
	for range spDecodes {
		d, _ := startSimEngine(t, "--role", "decode")
		decs = append(decs, d)
	}
	tok, err := tokenizer.Load(simModelDir)
	if err != nil {
		t.Fatal(err)
	}
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: decs, Policy: policy, Tokenizer: tok, ScrapeInterval: -1})
	waitHealthy(t, url)
	run := sharedPrefixRun{answers: map[string]string{}}
	for r := range spRequests {
		for g := range spGroups {
			prompt := fmt.Sprintf("%s Question %d: what should member %d of the team do today?", systemPrompt(g), r, r)
			body := fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":8,"temperature":0,"ignore_eos":true}`, prompt)
			a := ask(t, url, "/v1/completions", body)
			if a.status != http.StatusOK || a.pd != "remote" {
				t.Fatalf("group %d request %d: %d, x-tandem-pd %q: %s", g, r, a.status, a.pd, a.body)
			}
			run.answers[fmt.Sprintf("%d/%d", g, r)] = a.text
		}
	}
	// The counters are updated after each engine step: read them once
	// they stop moving.
	read := func() (h, q float64, each []string) {
		for _, d := range decs {
			dh, dq := metric(t, d, "vllm:prefix_cache_hits", ""), metric(t, d, "vllm:prefix_cache_queries", "")
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
	prefix := runSharedPrefix(t, factory.PolicyPrefix)
	rr := runSharedPrefix(t, factory.PolicyRoundRobin)
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
