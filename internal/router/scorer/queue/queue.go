// Package queue is the "queue" scorer, on the load engines report: their
// scraped vllm:num_requests_waiting (weighted double) and
// vllm:num_requests_running, relative to the busiest candidate. Engines whose
// metrics are stale or never scraped get a neutral 0.5, so a scrape that
// stopped neither attracts nor repels traffic.
package queue

import "github.com/tandem-serve/tandem/internal/router"

// Name is the scorer's name in the factory.
const Name = "queue"

// Scorer scores by scraped queue depth.
type Scorer struct{}

// Score implements router.Scorer.
func (Scorer) Score(_ *router.Request, eps []router.Endpoint, out []float64) {
	worst := 0.0
	for _, e := range eps {
		if e.Scraped {
			worst = max(worst, 2*e.Waiting+e.Running)
		}
	}
	for i, e := range eps {
		switch {
		case !e.Scraped:
			out[i] = 0.5
		case worst == 0:
			out[i] = 1
		default:
			out[i] = 1 - (2*e.Waiting+e.Running)/worst
		}
	}
}
