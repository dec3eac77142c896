// Package maxscore is the "max-score" picker: the endpoint with the highest
// weighted score, ties broken at random so that equal engines share the
// traffic instead of the first one taking all of it (Dynamo #3581).
package maxscore

import (
	"math/rand/v2"

	"github.com/tandem-serve/tandem/internal/router"
)

// Name is the picker's name in the factory.
const Name = "max-score"

// Picker picks the best score.
type Picker struct{}

// eps is the tolerance under which two scores are a tie.
const eps = 1e-9

// Pick implements router.Picker.
func (Picker) Pick(_ *router.Request, endpoints []router.Endpoint, scores []float64) int {
	best, n := 0, 0
	for i, s := range scores {
		switch {
		case i == 0 || s > scores[best]+eps:
			best, n = i, 1
		case s >= scores[best]-eps:
			// Reservoir sampling over the ties: each is kept with
			// probability 1/n.
			n++
			if rand.IntN(n) == 0 {
				best = i
			}
		}
	}
	_ = endpoints
	return best
}
