// Package p2c is the "power-of-two" picker: two endpoints drawn at random,
// the better scored of the two wins. It spreads load nearly as well as the
// maximum while never sending a burst to one engine, and costs O(1) however
// many engines there are (Mitzenmacher's power of two choices).
package p2c

import (
	"math/rand/v2"

	"github.com/tandem-serve/tandem/internal/router"
)

// Name is the picker's name in the factory.
const Name = "power-of-two"

// Picker picks the better of two random endpoints.
type Picker struct{}

// Pick implements router.Picker.
func (Picker) Pick(_ *router.Request, endpoints []router.Endpoint, scores []float64) int {
	n := len(endpoints)
	if n < 2 {
		return 0
	}
	a := rand.IntN(n)
	b := rand.IntN(n - 1)
	if b >= a {
		b++
	}
	if scores[b] > scores[a] {
		return b
	}
	return a
}
