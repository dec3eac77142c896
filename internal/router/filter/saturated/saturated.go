// Package saturated is the "not-saturated" filter: it drops engines that
// already have as much work as they should take, so a burst queues in the
// router (admission control) instead of piling onto engines. An engine is
// saturated when the router's own in-flight count reaches MaxInFlight, or
// when its freshly scraped waiting queue reaches MaxWaiting or its KV cache
// usage reaches MaxKVUsage. A zero limit is off.
package saturated

import "github.com/tandem-serve/tandem/internal/router"

// Name is the filter's name in the factory.
const Name = "not-saturated"

// Filter drops saturated endpoints.
type Filter struct {
	MaxInFlight int64
	MaxWaiting  float64
	MaxKVUsage  float64
}

// Saturated reports whether e is saturated under f's limits.
func (f *Filter) Saturated(e *router.Endpoint) bool {
	if f.MaxInFlight > 0 && e.InFlight >= f.MaxInFlight {
		return true
	}
	if e.Scraped {
		if f.MaxWaiting > 0 && e.Waiting >= f.MaxWaiting {
			return true
		}
		if f.MaxKVUsage > 0 && e.KVUsage >= f.MaxKVUsage {
			return true
		}
	}
	return false
}

// Filter implements router.Filter.
func (f *Filter) Filter(_ *router.Request, eps []router.Endpoint) []router.Endpoint {
	out := eps[:0]
	for i := range eps {
		if !f.Saturated(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}
