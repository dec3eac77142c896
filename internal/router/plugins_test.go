package router_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/always"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/router/filter/healthy"
	"github.com/tandem-serve/tandem/internal/router/filter/saturated"
	"github.com/tandem-serve/tandem/internal/router/picker/maxscore"
	"github.com/tandem-serve/tandem/internal/router/picker/p2c"
	"github.com/tandem-serve/tandem/internal/router/picker/roundrobin"
	"github.com/tandem-serve/tandem/internal/router/scorer/load"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
)

func TestRoundRobinPicker(t *testing.T) {
	tests := []struct {
		name string
		// sizes are the candidate counts of successive picks.
		sizes []int
		want  []int
	}{
		{"one candidate is always picked", []int{1, 1, 1}, []int{0, 0, 0}},
		{"three candidates in turn, from the first", []int{3, 3, 3, 3, 3, 3, 3}, []int{0, 1, 2, 0, 1, 2, 0}},
		{"the turn is a counter over picks, whatever the candidates", []int{4, 4, 2, 2, 3, 5}, []int{0, 1, 0, 1, 1, 0}},
		{"no candidate answers 0 without counting", []int{0, 2, 2}, []int{0, 0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p roundrobin.Picker // the zero value is ready
			for i, n := range tt.sizes {
				got := p.Pick(&router.Request{}, endpoints(n), make([]float64, n))
				if got != tt.want[i] {
					t.Fatalf("pick %d over %d candidates = %d, want %d (picks %v → %v)", i, n, got, tt.want[i], tt.sizes, tt.want)
				}
			}
		})
	}
	t.Run("scores are ignored", func(t *testing.T) {
		var p roundrobin.Picker
		for i := range 4 {
			if got := p.Pick(&router.Request{}, endpoints(2), []float64{0, 1}); got != i%2 {
				t.Fatalf("pick %d = %d, want %d", i, got, i%2)
			}
		}
	})
	t.Run("concurrent picks split exactly", func(t *testing.T) {
		var p roundrobin.Picker
		eps := endpoints(4)
		var mu sync.Mutex
		got := make([]int, len(eps))
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 100 {
					i := p.Pick(&router.Request{}, eps, nil)
					mu.Lock()
					got[i]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for i, n := range got {
			if n != 200 {
				t.Errorf("endpoint %d picked %d times of 800, want 200 (%v)", i, n, got)
			}
		}
	})
}

func TestAlwaysDecider(t *testing.T) {
	tests := []struct {
		name string
		in   router.DecideInput
	}{
		{"a short prompt", router.DecideInput{Req: &router.Request{PromptTokens: 4}, PrefillHealthy: 1, PrefillFree: 1}},
		{"a long prompt", router.DecideInput{Req: &router.Request{PromptTokens: 100000}, PrefillHealthy: 2, PrefillFree: 2}},
		{"a prompt the decode holds whole", router.DecideInput{Req: &router.Request{PromptTokens: 64, BlockSize: 16, BlockHashes: make([]uint64, 4)},
			Decode: router.Endpoint{PrefixBlocks: 4}, PrefillHealthy: 1, PrefillFree: 1}},
		{"a saturated prefill pool", router.DecideInput{Req: &router.Request{PromptTokens: 64}, PrefillHealthy: 1, PrefillFree: 0}},
		{"a decode under KV pressure", router.DecideInput{Req: &router.Request{PromptTokens: 64}, Decode: router.Endpoint{Scraped: true, KVUsage: 0.99}, PrefillHealthy: 1, PrefillFree: 1}},
		{"nothing known", router.DecideInput{Req: &router.Request{}}},
	}
	want := router.Decision{Remote: true, Reason: always.Name}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (always.Decider{}).Decide(tt.in); got != want {
				t.Errorf("Decide = %+v, want %+v", got, want)
			}
		})
	}
	// The factory's default decider is this one.
	for _, name := range []string{"", always.Name} {
		d, err := factory.Decider(name, factory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := d.(always.Decider); !ok {
			t.Errorf("factory.Decider(%q) = %T, want always.Decider", name, d)
		}
	}
}

func TestFromSpec(t *testing.T) {
	opts := factory.Options{MaxInFlight: 3}
	tests := []struct {
		name    string
		spec    factory.Spec
		wantErr string // substring of the error; "" for success
		// On success: the filters (healthy is always first), the scorers
		// with their weights, the picker.
		filters []string
		scorers map[string]float64
		picker  router.Picker
	}{
		{name: "empty: healthy and max-score", spec: factory.Spec{}, filters: []string{healthy.Name}, picker: maxscore.Picker{}},
		{name: "named healthy is not doubled", spec: factory.Spec{Filters: []string{healthy.Name, saturated.Name}},
			filters: []string{healthy.Name, saturated.Name}, picker: maxscore.Picker{}},
		{name: "scorers keep their weights", spec: factory.Spec{Scorers: []factory.WeightedName{{Name: prefix.Name, Weight: 2}, {Name: load.Name, Weight: 0}}, Picker: p2c.Name},
			filters: []string{healthy.Name}, scorers: map[string]float64{prefix.Name: 2, load.Name: 0}, picker: p2c.Picker{}},
		{name: "round-robin", spec: factory.Spec{Picker: roundrobin.Name}, filters: []string{healthy.Name}, picker: &roundrobin.Picker{}},
		{name: "unknown filter", spec: factory.Spec{Filters: []string{"healthy", "fastest"}}, wantErr: `unknown filter "fastest"`},
		{name: "unknown scorer", spec: factory.Spec{Scorers: []factory.WeightedName{{Name: "load", Weight: 1}, {Name: "vibes", Weight: 1}}}, wantErr: `unknown scorer "vibes"`},
		{name: "negative weight", spec: factory.Spec{Scorers: []factory.WeightedName{{Name: "load", Weight: -1}}}, wantErr: "negative weight"},
		{name: "unknown picker", spec: factory.Spec{Picker: "lottery"}, wantErr: `unknown picker "lottery"`},
		{name: "a picker name in the wrong case", spec: factory.Spec{Picker: "Max-Score"}, wantErr: `unknown picker "Max-Score"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prof, err := factory.FromSpec(tt.spec, opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromSpec = %v, %v; want an error with %q", prof, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var filters []string
			for _, f := range prof.Filters {
				switch f := f.(type) {
				case healthy.Filter:
					filters = append(filters, healthy.Name)
				case *saturated.Filter:
					if f.MaxInFlight != opts.MaxInFlight {
						t.Errorf("not-saturated filter %+v, want the options' limits", *f)
					}
					filters = append(filters, saturated.Name)
				default:
					t.Errorf("filter %T", f)
				}
			}
			if strings.Join(filters, ",") != strings.Join(tt.filters, ",") {
				t.Errorf("filters %v, want %v", filters, tt.filters)
			}
			if len(prof.Scorers) != len(tt.scorers) {
				t.Errorf("scorers %+v, want %v", prof.Scorers, tt.scorers)
			}
			for _, s := range prof.Scorers {
				if w, ok := tt.scorers[s.Name]; !ok || w != s.Weight || s.Scorer == nil {
					t.Errorf("scorer %+v, want %v", s, tt.scorers)
				}
			}
			switch tt.picker.(type) {
			case maxscore.Picker:
				_, ok := prof.Picker.(maxscore.Picker)
				if !ok {
					t.Errorf("picker %T, want max-score", prof.Picker)
				}
			case p2c.Picker:
				if _, ok := prof.Picker.(p2c.Picker); !ok {
					t.Errorf("picker %T, want power-of-two", prof.Picker)
				}
			case *roundrobin.Picker:
				if _, ok := prof.Picker.(*roundrobin.Picker); !ok {
					t.Errorf("picker %T, want round-robin", prof.Picker)
				}
			}
		})
	}
}

func TestFactoryRejectsUnknownNames(t *testing.T) {
	tests := []struct {
		name    string
		err     func() error
		wantErr string
	}{
		{"policy", func() error { _, err := factory.Profile("fastest", "decode", factory.Options{}); return err }, `unknown policy "fastest"`},
		{"scorer", func() error { _, err := factory.Scorer("vibes"); return err }, `unknown scorer "vibes"`},
		{"decider", func() error { _, err := factory.Decider("sometimes", factory.Options{}); return err }, `unknown pd decider "sometimes"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.err(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want one with %q", err, tt.wantErr)
			}
		})
	}
	for _, policy := range factory.Policies() {
		for _, role := range []string{"prefill", "decode"} {
			if _, err := factory.Profile(policy, role, factory.Options{}); err != nil {
				t.Errorf("Profile(%q, %q): %v", policy, role, err)
			}
		}
	}
}
