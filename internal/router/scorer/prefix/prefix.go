// Package prefix is the "prefix" scorer: the fraction of the request's
// leading blocks an engine holds in its prefix cache (Endpoint.PrefixBlocks
// over the request's block count). The router fills PrefixBlocks from an
// Index before the pipeline runs: the precise one fed by the engines' KV
// events when they publish them, or Approx, the router's own record of
// where it sent which prefixes.
package prefix

import "github.com/tandem-serve/tandem/internal/router"

// Name is the scorer's name in the factory.
const Name = "prefix"

// Index answers, for a request's chained block hashes, how many leading
// blocks each engine holds. Match calls f once per engine holding at least
// the first block. Observe tells the index that the request was sent to
// engine (an approximate index records it; a precise one may ignore it).
type Index interface {
	Match(hashes []uint64, f func(engine string, blocks int))
	Observe(engine string, hashes []uint64)
}

// Scorer scores by prefix hit.
type Scorer struct{}

// Score implements router.Scorer.
func (Scorer) Score(req *router.Request, eps []router.Endpoint, out []float64) {
	n := len(req.BlockHashes)
	if n == 0 {
		return
	}
	for i, e := range eps {
		out[i] = float64(min(e.PrefixBlocks, n)) / float64(n)
	}
}
