// Package queue is the "queue" scorer, on the load engines report: their
// scraped vllm:num_requests_waiting (weighted double) and
// vllm:num_requests_running, corrected by the requests the router opened
// and closed on each since that scrape (Endpoint.SinceScrape), relative to
// the busiest candidate. Without the correction a burst went to the engine
// whose last scrape showed it idle until the next scrape (every 250 ms):
// one engine of four queued 8–20 of a 60-request burst's requests while the
// others queued 0–5. Engines whose
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
			worst = max(worst, depth(e))
		}
	}
	for i, e := range eps {
		switch {
		case !e.Scraped:
			out[i] = 0.5
		case worst == 0:
			out[i] = 1
		default:
			out[i] = 1 - depth(e)/worst
		}
	}
}

// depth is e's queue as scraped, plus the requests opened on it since (a
// request sent counts as one running; one finished since takes one off).
func depth(e router.Endpoint) float64 {
	return max(2*e.Waiting+e.Running+float64(e.SinceScrape), 0)
}
