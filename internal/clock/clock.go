// Package clock is the one time source Tandem's stateful components read:
// engines stamp requests with it, KV producers stamp and expire leases with
// it. Tests inject a fake; under testing/synctest the system clock is
// already fake.
package clock

import "time"

// Clock reads the current time.
type Clock interface{ Now() time.Time }

// System is the wall clock.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }
