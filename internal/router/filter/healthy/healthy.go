// Package healthy is the "healthy" filter: it keeps the endpoints whose last
// health check passed and that the circuit breaker has not ejected.
package healthy

import "github.com/tandem-serve/tandem/internal/router"

// Name is the filter's name in the factory.
const Name = "healthy"

// Filter keeps healthy endpoints.
type Filter struct{}

// Filter implements router.Filter.
func (Filter) Filter(_ *router.Request, eps []router.Endpoint) []router.Endpoint {
	out := eps[:0]
	for _, e := range eps {
		if e.Healthy {
			out = append(out, e)
		}
	}
	return out
}
