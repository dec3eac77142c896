// Package always is the "always" disaggregation decider: every request is
// prefilled remotely when a prefill engine can take it (the proxy's behaviour
// before conditional disaggregation, and what P/D benchmarks want).
package always

import "github.com/tandem-serve/tandem/internal/router"

// Name is the decider's name in the factory.
const Name = "always"

// Decider always says remote.
type Decider struct{}

// Decide implements router.Decider.
func (Decider) Decide(router.DecideInput) router.Decision {
	return router.Decision{Remote: true, Reason: "always"}
}
