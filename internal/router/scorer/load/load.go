// Package load is the "load" scorer, on the router's own accounting: an
// engine's score falls with the tokens (prompt + expected output) the router
// has in flight on it, relative to the busiest candidate, with the request
// count as a tie-breaker. The accounting is updated at dispatch, before the
// next pick, so requests arriving in the same millisecond spread out instead
// of herding onto the engine that looked idle (Dynamo #589).
package load

import "github.com/tandem-serve/tandem/internal/router"

// Name is the scorer's name in the factory.
const Name = "load"

// Scorer scores by in-flight tokens and requests.
type Scorer struct{}

// Score implements router.Scorer: 1 for the least loaded, 0 for the most.
func (Scorer) Score(_ *router.Request, eps []router.Endpoint, out []float64) {
	var maxTok, maxReq int64
	for _, e := range eps {
		maxTok = max(maxTok, e.InFlightTokens)
		maxReq = max(maxReq, e.InFlight)
	}
	for i, e := range eps {
		s := 1.0
		if maxTok > 0 {
			s = 1 - 0.9*float64(e.InFlightTokens)/float64(maxTok)
		}
		if maxReq > 0 {
			s -= 0.1 * float64(e.InFlight) / float64(maxReq)
		}
		out[i] = s
	}
}
