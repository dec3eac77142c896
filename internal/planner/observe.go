package planner

// What the planner observes: the routed requests (ObserveRequest, with
// their produced output lengths from ObserveOutput) and the engines' scraped
// costs (ObserveEngine), and their trimming to the window. The measured
// prefills (ObservePrefill) are in prefillcurve.go.

import (
	"cmp"
	"slices"
	"time"
)

// Request is one routed request as the router saw it.
type Request struct {
	// At is when it arrived, ID its request id (for ObserveOutput; "" when
	// its output will not be told).
	At time.Time
	ID string
	// PromptTokens is its prompt's length, UncachedTokens the part its
	// decode did not hold cached, OutputTokens its output: max_tokens
	// until it finished, then what it produced (ObserveOutput).
	PromptTokens, UncachedTokens, OutputTokens int
	// Finished says OutputTokens is what it produced.
	Finished bool

	seq  uint64    // its place in the order of ObserveRequest
	done time.Time // when its answer ended (ObserveOutput), zero until then
}

// EngineSample is one scrape of an engine's costs. Zero costs are unknown.
type EngineSample struct {
	// At is when it was scraped; URL names the engine.
	At  time.Time
	URL string
	// Decode says the engine was in the decode pool: its ITL and batch
	// are a point of the decode step-time fit.
	Decode bool
	// PrefillSecondsPerToken is its measured prefill cost,
	// TransferSecondsPerToken its KV pulls' cost per token.
	PrefillSecondsPerToken, TransferSecondsPerToken float64
	// ITLSeconds is its mean inter-token latency since its previous
	// sample, and Running its mean number of requests running then.
	ITLSeconds, Running float64
	// MaxBatchedTokens is its --max-num-batched-tokens when it says so
	// (0: unknown; Config.MaxBatchedTokens stands for it).
	MaxBatchedTokens int
	// Idle says it had no request running or waiting when scraped: its
	// last decode points stay usable, however old (an idle engine's step
	// costs have not changed), where a busy engine's must be fresh.
	Idle bool
}

// idlePoints is how many of an engine's last decode points are kept for
// when it is idle.
const idlePoints = 8

// ObserveRequest records a routed request.
func (pl *Planner) ObserveRequest(r Request) {
	pl.seq++
	r.seq = pl.seq
	if r.ID != "" {
		if pl.ids == nil {
			pl.ids = map[string]uint64{}
		}
		pl.ids[r.ID] = r.seq
	}
	pl.reqs = append(pl.reqs, r)
	pl.arrivals = append(pl.arrivals, Request{At: r.At, seq: r.seq})
}

// ObserveOutput records that the request id (its Request.ID) finished at
// at with tokens output tokens: the model counts those rather than its
// max_tokens, and the arrivals' bursts end where every request before a
// gap had finished (largestBurst). A request no longer in the window, or
// never observed, is ignored.
func (pl *Planner) ObserveOutput(id string, tokens int, at time.Time) {
	seq, ok := pl.ids[id]
	if !ok {
		return
	}
	delete(pl.ids, id)
	bySeq := func(r Request, seq uint64) int { return cmp.Compare(r.seq, seq) }
	if i, found := slices.BinarySearchFunc(pl.reqs, seq, bySeq); found {
		pl.reqs[i].OutputTokens, pl.reqs[i].Finished = tokens, true
	}
	if i, found := slices.BinarySearchFunc(pl.arrivals, seq, bySeq); found {
		pl.arrivals[i].done = at
	}
}

// ObserveEngine records a scrape of an engine's costs.
func (pl *Planner) ObserveEngine(s EngineSample) {
	pl.samples = append(pl.samples, s)
	if s.Decode && s.Running > 0 && s.ITLSeconds > 0 {
		if pl.lastPoints == nil {
			pl.lastPoints = map[string][]EngineSample{}
		}
		pts := append(pl.lastPoints[s.URL], s)
		pl.lastPoints[s.URL] = pts[max(len(pts)-idlePoints, 0):]
	}
}

// trim drops what fell out of the window.
func (pl *Planner) trim(now time.Time) {
	from := now.Add(-pl.cfg.Window)
	pl.reqs = slices.DeleteFunc(pl.reqs, func(r Request) bool {
		if r.At.Before(from) {
			delete(pl.ids, r.ID)
			return true
		}
		return false
	})
	pl.samples = slices.DeleteFunc(pl.samples, func(s EngineSample) bool { return s.At.Before(from) })
	longer := now.Add(-dispersionWindows * pl.cfg.Window)
	pl.arrivals = slices.DeleteFunc(pl.arrivals, func(r Request) bool { return r.At.Before(longer) })
	pl.prefills = slices.DeleteFunc(pl.prefills, func(s PrefillSample) bool { return s.At.Before(from) })
}
