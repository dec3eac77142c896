// Package roundrobin is the "round-robin" picker: each request goes to the
// next candidate in turn, whatever the scores. It needs no load or cache
// information and is the baseline the other policies are measured against.
package roundrobin

import (
	"sync/atomic"

	"github.com/tandem-serve/tandem/internal/router"
)

// Name is the picker's name in the factory.
const Name = "round-robin"

// Picker rotates over the candidates it is offered. The zero value is ready.
type Picker struct {
	next atomic.Uint64
}

// Pick implements router.Picker.
func (p *Picker) Pick(_ *router.Request, endpoints []router.Endpoint, _ []float64) int {
	if len(endpoints) == 0 {
		return 0
	}
	n := p.next.Add(1) - 1
	return int(n % uint64(len(endpoints)))
}
