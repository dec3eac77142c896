// Package roundrobin is the round-robin picking policy ("round-robin"): each
// request goes to the next healthy backend in turn. It needs no load or cache
// information, so it is the default and the baseline the smarter policies are
// measured against. Unhealthy backends are skipped because the proxy only
// offers healthy ones; the rotation continues over those that remain.
package roundrobin

import (
	"sync/atomic"

	"github.com/tandem-serve/tandem/internal/proxy/picker"
)

// Name is the policy's name in the proxy's --policy flag.
const Name = "round-robin"

// Picker rotates over the endpoints it is offered. The zero value is ready to
// use.
type Picker struct {
	next atomic.Uint64
}

var _ picker.Picker = (*Picker)(nil)

// New returns a round-robin Picker.
func New() *Picker { return &Picker{} }

// Pick returns the next endpoint in turn.
func (p *Picker) Pick(_ *picker.Request, endpoints []picker.Endpoint) int {
	if len(endpoints) == 0 {
		return 0
	}
	n := p.next.Add(1) - 1
	return int(n % uint64(len(endpoints)))
}
