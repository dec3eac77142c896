package factory

import (
	"fmt"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/filter/healthy"
	"github.com/tandem-serve/tandem/internal/router/filter/saturated"
	"github.com/tandem-serve/tandem/internal/router/picker/maxscore"
	"github.com/tandem-serve/tandem/internal/router/picker/p2c"
	"github.com/tandem-serve/tandem/internal/router/picker/roundrobin"
)

// Spec is one pool's pipeline spelled out plugin by plugin, as in the
// proxy's YAML config file:
//
//	filters: [healthy, not-saturated]
//	scorers:
//	  - {name: prefix, weight: 2}
//	  - {name: load, weight: 1}
//	picker: max-score
//
// The healthy filter is always applied first, named or not.
type Spec struct {
	Filters []string       `yaml:"filters" json:"filters"`
	Scorers []WeightedName `yaml:"scorers" json:"scorers"`
	Picker  string         `yaml:"picker" json:"picker"`
}

// WeightedName is a scorer by name and its weight.
type WeightedName struct {
	Name   string  `yaml:"name" json:"name"`
	Weight float64 `yaml:"weight" json:"weight"`
}

// Pickers returns the picker names.
func Pickers() []string { return []string{maxscore.Name, p2c.Name, roundrobin.Name} }

// FromSpec builds a pipeline from s, with o's saturation limits for the
// not-saturated filter.
func FromSpec(s Spec, o Options) (*router.Profile, error) {
	prof := &router.Profile{Filters: []router.Filter{healthy.Filter{}}}
	for _, f := range s.Filters {
		switch f {
		case healthy.Name:
		case saturated.Name:
			prof.Filters = append(prof.Filters, Saturation(o))
		default:
			return nil, fmt.Errorf("unknown filter %q (known: %s, %s)", f, healthy.Name, saturated.Name)
		}
	}
	for _, w := range s.Scorers {
		sc, err := Scorer(w.Name)
		if err != nil {
			return nil, err
		}
		if w.Weight < 0 {
			return nil, fmt.Errorf("scorer %s: negative weight %v", w.Name, w.Weight)
		}
		prof.Scorers = append(prof.Scorers, router.Weighted{Name: w.Name, Scorer: sc, Weight: w.Weight})
	}
	switch s.Picker {
	case maxscore.Name, "":
		prof.Picker = maxscore.Picker{}
	case p2c.Name:
		prof.Picker = p2c.Picker{}
	case roundrobin.Name:
		prof.Picker = &roundrobin.Picker{}
	default:
		return nil, fmt.Errorf("unknown picker %q (known: %v)", s.Picker, Pickers())
	}
	return prof, nil
}
