// Package factory makes the router's plugins and pipelines by name: the one
// place that knows every plugin. A new plugin is a folder under router/ and
// one line here; the proxy's request flow does not change.
//
// A policy names a whole pipeline per pool:
//
//	round-robin   healthy → round-robin (no scores)
//	load          healthy, not-saturated → load + queue + kv-usage → max-score
//	power-of-two  healthy, not-saturated → load + queue → power-of-two
//	prefix        healthy, not-saturated → 2·prefix + load + queue + 0.5·kv-usage → max-score
//	              (on the prefill pool, prefix is replaced by same-host)
//
// Plugins can also be assembled one by one with Filter, Scorer, Picker and
// Decider.
package factory

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/always"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
	"github.com/tandem-serve/tandem/internal/router/filter/healthy"
	"github.com/tandem-serve/tandem/internal/router/filter/saturated"
	"github.com/tandem-serve/tandem/internal/router/picker/maxscore"
	"github.com/tandem-serve/tandem/internal/router/picker/p2c"
	"github.com/tandem-serve/tandem/internal/router/picker/roundrobin"
	"github.com/tandem-serve/tandem/internal/router/scorer/kvusage"
	"github.com/tandem-serve/tandem/internal/router/scorer/load"
	"github.com/tandem-serve/tandem/internal/router/scorer/locality"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
	"github.com/tandem-serve/tandem/internal/router/scorer/queue"
)

// Options are the knobs of the plugins that have any.
type Options struct {
	// Saturation limits (see package saturated); zero is off.
	MaxInFlight int64
	MaxWaiting  float64
	MaxKVUsage  float64
	// Conditional decider (see package conditional); the priced decider
	// applies them too.
	Threshold        int
	MustRemote       int
	DecodeKVPressure float64
	// TTFTObjective is the priced decider's time-to-first-token objective
	// (see package priced; zero: its default).
	TTFTObjective time.Duration
	// TPOTObjective is the priced decider's time-per-output-token
	// objective, which bounds what a local prefill may stall the decode's
	// streams (zero: its default).
	TPOTObjective time.Duration
}

// Policy names.
const (
	PolicyRoundRobin = roundrobin.Name
	PolicyLoad       = "load"
	PolicyP2C        = p2c.Name
	PolicyPrefix     = prefix.Name
)

var policies = []string{PolicyRoundRobin, PolicyLoad, PolicyP2C, PolicyPrefix}

// Policies returns the policy names, sorted.
func Policies() []string {
	out := slices.Clone(policies)
	sort.Strings(out)
	return out
}

// Deciders returns the decider names.
func Deciders() []string { return []string{always.Name, conditional.Name, priced.Name} }

// Profile makes the pipeline of policy for a pool of role ("prefill" or
// "decode").
func Profile(policy, role string, o Options) (*router.Profile, error) {
	sat := &saturated.Filter{MaxInFlight: o.MaxInFlight, MaxWaiting: o.MaxWaiting, MaxKVUsage: o.MaxKVUsage}
	filters := []router.Filter{healthy.Filter{}, sat}
	w := func(name string, weight float64) router.Weighted {
		s, _ := Scorer(name)
		return router.Weighted{Name: name, Scorer: s, Weight: weight}
	}
	switch policy {
	case PolicyRoundRobin:
		return &router.Profile{Filters: filters, Picker: &roundrobin.Picker{}}, nil
	case PolicyLoad:
		return &router.Profile{Filters: filters, Scorers: []router.Weighted{w(load.Name, 1), w(queue.Name, 1), w(kvusage.Name, 0.5)}, Picker: maxscore.Picker{}}, nil
	case PolicyP2C:
		return &router.Profile{Filters: filters, Scorers: []router.Weighted{w(load.Name, 1), w(queue.Name, 1)}, Picker: p2c.Picker{}}, nil
	case PolicyPrefix:
		first := w(prefix.Name, 2)
		if role == "prefill" {
			first = w(locality.Name, 0.5)
		}
		return &router.Profile{Filters: filters, Scorers: []router.Weighted{first, w(load.Name, 1), w(queue.Name, 1), w(kvusage.Name, 0.5)}, Picker: maxscore.Picker{}}, nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: %v)", policy, Policies())
}

// Scorer makes a scorer by name.
func Scorer(name string) (router.Scorer, error) {
	switch name {
	case load.Name:
		return load.Scorer{}, nil
	case queue.Name:
		return queue.Scorer{}, nil
	case kvusage.Name:
		return kvusage.Scorer{}, nil
	case prefix.Name:
		return prefix.Scorer{}, nil
	case locality.Name:
		return locality.Scorer{}, nil
	}
	return nil, fmt.Errorf("unknown scorer %q", name)
}

// Decider makes a disaggregation decider by name.
func Decider(name string, o Options) (router.Decider, error) {
	switch name {
	case always.Name, "":
		return always.Decider{}, nil
	case conditional.Name:
		return &conditional.Decider{Threshold: o.Threshold, MustRemote: o.MustRemote, DecodeKVPressure: o.DecodeKVPressure}, nil
	case priced.Name:
		return &priced.Decider{TTFTObjective: o.TTFTObjective, TPOTObjective: o.TPOTObjective,
			Static: conditional.Decider{Threshold: o.Threshold, MustRemote: o.MustRemote, DecodeKVPressure: o.DecodeKVPressure}}, nil
	}
	return nil, fmt.Errorf("unknown pd decider %q (known: %v)", name, Deciders())
}

// Saturation returns the not-saturated filter of o, for admission control
// and for the decider's view of the prefill pool.
func Saturation(o Options) *saturated.Filter {
	return &saturated.Filter{MaxInFlight: o.MaxInFlight, MaxWaiting: o.MaxWaiting, MaxKVUsage: o.MaxKVUsage}
}
