// Package kvusage is the "kv-usage" scorer: 1 − the engine's scraped
// vllm:kv_cache_usage_perc, so engines with free KV blocks are preferred;
// 0.5 when the metric is stale or missing.
package kvusage

import "github.com/tandem-serve/tandem/internal/router"

// Name is the scorer's name in the factory.
const Name = "kv-usage"

// Scorer scores by free KV cache.
type Scorer struct{}

// Score implements router.Scorer.
func (Scorer) Score(_ *router.Request, eps []router.Endpoint, out []float64) {
	for i, e := range eps {
		if e.Scraped {
			out[i] = 1 - e.KVUsage
		} else {
			out[i] = 0.5
		}
	}
}
