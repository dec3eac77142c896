// Package locality is the "same-host" scorer for the prefill pool: 1 for a
// prefill engine on the host of the decode already chosen (the KV then moves
// through shared memory instead of TCP), 0 otherwise.
package locality

import "github.com/tandem-serve/tandem/internal/router"

// Name is the scorer's name in the factory.
const Name = "same-host"

// Scorer prefers the decode's host.
type Scorer struct{}

// Score implements router.Scorer.
func (Scorer) Score(req *router.Request, eps []router.Endpoint, out []float64) {
	for i, e := range eps {
		if req.Near != "" && e.Host == req.Near {
			out[i] = 1
		}
	}
}
