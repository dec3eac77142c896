package proxy

import (
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
)

// TestPlannerStartsBeforeDiscoveryDeliversThePools: with discovery
// (Kubernetes, a backends file) the pools are empty when the proxy starts;
// the planner must start all the same and count them at each decision.
func TestPlannerStartsBeforeDiscoveryDeliversThePools(t *testing.T) {
	p, err := New(Config{DynamicBackends: true, Planner: &planner.Config{TTFT: time.Second, TPOT: 50 * time.Millisecond}})
	if err != nil {
		t.Fatalf("New with discovery and the planner: %v", err)
	}
	pre, dec := newFake(t, prefillOK), newFake(t, decodeJSON)
	dec2 := newFake(t, decodeJSON)
	if err := p.SetBackends(rolePrefill, []string{pre.URL()}); err != nil {
		t.Fatal(err)
	}
	if err := p.SetBackends(roleDecode, []string{dec.URL(), dec2.URL()}); err != nil {
		t.Fatal(err)
	}
	if d := p.planOnce(time.Now()); d.Prefill+d.Decode != 3 {
		t.Errorf("decision %dP:%dD, want the 3 engines discovery delivered", d.Prefill, d.Decode)
	}
}

// TestPlannerPublishingStartsFromTheDiscoveredSplit: discovery delivered
// 2 prefill and 2 decode engines; until the planner changes the split, its
// decisions (held for want of samples) publish the pools' split, not its
// start guess of MinPrefill, which `--planner-scale` would otherwise apply
// to the Deployments before the proxy saw a request.
func TestPlannerPublishingStartsFromTheDiscoveredSplit(t *testing.T) {
	p, err := New(Config{DynamicBackends: true, Planner: &planner.Config{TTFT: time.Second, TPOT: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var pre, dec []string
	for range 2 {
		pre = append(pre, newFake(t, prefillOK).URL())
		dec = append(dec, newFake(t, decodeJSON).URL())
	}
	if err := p.SetBackends(rolePrefill, pre); err != nil {
		t.Fatal(err)
	}
	if err := p.SetBackends(roleDecode, dec); err != nil {
		t.Fatal(err)
	}
	if d := p.planOnce(time.Now()); d.Prefill != 2 || d.Decode != 2 || d.Held == "" {
		t.Errorf("first decision %dP:%dD (held %q), want the discovered 2P:2D, held", d.Prefill, d.Decode, d.Held)
	}
}
