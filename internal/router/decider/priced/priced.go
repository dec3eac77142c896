// Package priced is the "priced" disaggregation decider: load or recompute,
// priced per request from the engines' live measurements instead of a
// static token threshold.
//
// For a request whose prompt has n tokens, u of them not in the chosen
// decode's prefix cache, it estimates in seconds:
//
//	local TTFT  = wait_L + P_D(u)
//	remote TTFT = seat_D + wait_P + P_P(n) + X_D(u) + first_D   (the best prefill engine)
//	local stall = P_D(u), which each of the decode's R running streams waits
//	              for its next token while the prompt is prefilled beside it
//
// P_D and P_P are the decode's and the prefill's prefill seconds for a
// prompt: the curve A + B·n + C·n² the proxy fits to each engine's own legs
// (Endpoint.PrefillCurve: every answer's Server-Timing prefill against the
// tokens it computed), else the engine's scraped seconds per token times
// the tokens; one stands in for the other while it is unmeasured (the same
// model). The remote path includes its decode leg: seat_D, the decode's wait
// before it runs a request (its remote legs' recent Server-Timing queue,
// Endpoint.DecodeQueueSeconds, or its scraped mean queue time while
// requests wait there, whichever is larger), X_D its KV pull's seconds for
// u tokens (a curve fitted to the legs' kv_pull, Endpoint.PullCurve, else u
// times the scraped transfer seconds per token; 0 until measured) and
// first_D the first step after the pull (the legs' kv_ready
// and prefill, else the scraped inter-token latency). wait_P is the
// prefill's queue: the proxy's prefill legs in flight on it priced by its
// curve (Endpoint.PrefillQueueSeconds; without a curve the prompt tokens
// in flight at its per-token cost), or its mean recent queue time while
// requests wait there, whichever is larger. wait_L is the local path's
// queue on the decode: seat_D, or the local prefills the router has sent it
// and not yet seen answered priced the same way, whichever is larger (a
// remote request's KV is pulled, not computed behind them). The router's
// own counts are current where a scrape is a window late, and include the
// requests routed since.
//
// R is the requests the router has open on the decode besides this one
// (Endpoint.InFlight less one: the proxy picks the decode, and counts the
// request on it, before it decides): its own accounting, exact and current,
// where the scraped vllm:num_requests_running lags by up to three scrape
// intervals and would count a stream that has just ended.
//
// Each estimate is a point; the router acts on it a scrape window late and
// every request it routes meanwhile joins the same queues, so a path counts
// as within the TTFT objective only with a margin that grows with what is
// uncertain in it: its upper bound, TTFT + QueueError·queue +
// RateError·compute (queue the waits in it, compute the rest), must be
// within the objective. Without the margin the prefill queue fills up to
// the objective and the estimate's lag puts the tail past it.
//
// A local prefill is within the TPOT objective when the stall it costs each
// running stream, spread over a stream as long as this request's expected
// output (MaxTokens), takes at most StallShare of the objective:
// stall ≤ StallShare·TPOT·(MaxTokens − 1). No running stream, no stall.
//
// It takes whichever finishes first within the objectives, pricing the
// local path with the time its running streams lose:
//
//  1. both within them → the cheaper of local and remote (TTFT), local on
//     a tie, the local price its TTFT plus each running stream's stall
//     weighed as the share of the stream's TPOT budget it spends, at the
//     TTFT objective's worth: TTFT + R·stall·TTFT_obj/(TPOT_obj·(MaxTokens
//     − 1)) (LocalCost); reason=priced_cheaper;
//  2. one within them → that one: reason=priced_margin when the remote
//     estimate itself is within the TTFT objective but not its margin,
//     priced_stall when the local TTFT is within but its stall is not
//     within the TPOT objective, else priced_within_slo;
//  3. neither → the sooner TTFT, reason=priced_sooner; or, when the
//     threshold is a planner's (Planned), the conditional decider at that
//     threshold, reason=planned_ + its reason: the planner sized the split
//     for the prompts from its threshold up to be prefilled remotely, and a
//     request that misses the objectives either way is best placed where
//     the split expects it (a long prompt kept local because it is sooner
//     stalls the decode's streams and queues the short prompts behind it,
//     which the planner's model kept local and counted as served).
//
// Before it prices, the conditional decider's rules that do not depend on
// the threshold apply as they are (must_remote, prefill_saturated,
// decode_kv_pressure). When the decode's or every free prefill's metrics
// are stale, or no prefill rate has been measured yet, the conditional
// decider decides by its static threshold, and the reason is its reason
// prefixed with "unpriced_". (A prefill cost is measured once either side
// has a curve from its legs or a scraped per-token rate.)
package priced

import (
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
)

// Name is the decider's name in the factory.
const Name = "priced"

// Reasons.
const (
	Cheaper   = "priced_cheaper"
	WithinSLO = "priced_within_slo"
	// Margin: the remote estimate is within the TTFT objective but not
	// with its margin, and the local path is taken.
	Margin = "priced_margin"
	// Stall: a local prefill would be within the TTFT objective but stall
	// the decode's running streams past the TPOT objective, and the remote
	// path is taken.
	Stall  = "priced_stall"
	Sooner = "priced_sooner"
	// Unpriced prefixes the static decider's reason when the metrics do
	// not allow a price.
	Unpriced = "unpriced_"
	// Planned prefixes the static decider's reason when neither path is
	// within the objectives and the threshold is a planner's (Planned).
	Planned = "planned_"
)

// The objectives when none are set.
const (
	DefaultTTFTObjective = 2 * time.Second
	DefaultTPOTObjective = 100 * time.Millisecond
)

// The margins (see the package comment).
const (
	// QueueError is the relative error allowed for a queue estimate: it is
	// a scrape window late, and the requests routed since join it.
	QueueError = 0.5
	// RateError is the relative error allowed for a compute estimate: the
	// measured seconds per token of a past window.
	RateError = 0.2
	// StallShare is the share of a stream's TPOT budget one local prefill
	// may take.
	StallShare = 0.5
)

// Decider prices remote and local prefill per request.
type Decider struct {
	// TTFTObjective is the time to first token a request should meet
	// (default DefaultTTFTObjective).
	TTFTObjective time.Duration
	// TPOTObjective is the time per output token the decode's running
	// streams should meet (default DefaultTPOTObjective).
	TPOTObjective time.Duration
	// Static is the conditional decider whose load rules apply first and
	// whose threshold decides when there is no price.
	Static conditional.Decider
	// Planned says Static's threshold is a planner's, fitted to the
	// traffic the split is sized for: it then also decides the requests
	// neither path serves within the objectives (rule 3).
	Planned bool
}

// Price is the estimate for one request, in seconds.
type Price struct {
	// LocalTTFT and RemoteTTFT are the estimated times to first token.
	LocalTTFT, RemoteTTFT float64
	// LocalStall is how long each of the decode's running streams waits
	// for the local prefill.
	LocalStall float64
	// LocalQueue and RemoteQueue are the waits in LocalTTFT and
	// RemoteTTFT: the part of each that is a queue.
	LocalQueue, RemoteQueue float64
	// Streams is how many streams the decode runs besides this request,
	// and Output this request's expected output tokens.
	Streams, Output int
	// Prefill is the index into DecideInput.Prefill of the prefill engine
	// priced for the remote path.
	Prefill int
}

// Decide implements router.Decider.
func (d *Decider) Decide(in router.DecideInput) router.Decision {
	static := d.Static.Decide(in)
	switch static.Reason {
	case conditional.MustRemote, conditional.PrefillSaturated, conditional.DecodeKVPressure:
		return static
	}
	p, ok := Estimate(in)
	if !ok {
		return router.Decision{Remote: static.Remote, Reason: Unpriced + static.Reason}
	}
	ttft, tpot := d.TTFTObjective, d.TPOTObjective
	if ttft <= 0 {
		ttft = DefaultTTFTObjective
	}
	if tpot <= 0 {
		tpot = DefaultTPOTObjective
	}
	dec := Choose(p, ttft.Seconds(), tpot.Seconds())
	if dec.Reason == Sooner && d.Planned {
		return router.Decision{Remote: static.Remote, Reason: Planned + static.Reason}
	}
	return dec
}

// Upper is the upper bound of a TTFT estimate of which queue seconds are
// waits: the estimate with its margin.
func Upper(ttft, queue float64) float64 {
	return ttft + QueueError*queue + RateError*max(ttft-queue, 0)
}

// StallBudget is the most a local prefill may stall each running stream
// when a stream has output tokens and the TPOT objective is tpot seconds.
func StallBudget(output int, tpot float64) float64 {
	return StallShare * tpot * float64(max(output-1, 1))
}

// LocalCost is the local path's price in seconds of TTFT, with the TTFT
// and TPOT objectives ttft and tpot in seconds: LocalTTFT plus the stall
// of every running stream, each weighed as the share of its TPOT budget it
// takes (the stall over TPOT·(Output − 1)) at the TTFT objective's worth:
// LocalTTFT + R·stall·ttft / (tpot·(Output − 1)). A stall is priced by how
// much of the streams' objective it spends, as a TTFT is by its own: a
// second of stall spread over a long answer costs its streams little, while
// a second of queue costs the request its objective.
func LocalCost(p Price, ttft, tpot float64) float64 {
	return p.LocalTTFT + float64(p.Streams)*p.LocalStall*ttft/(tpot*float64(max(p.Output-1, 1)))
}

// Choose applies the rules of the package comment to a price, with the
// TTFT and TPOT objectives ttft and tpot in seconds.
func Choose(p Price, ttft, tpot float64) router.Decision {
	inRemote := Upper(p.RemoteTTFT, p.RemoteQueue) <= ttft
	localTTFT := Upper(p.LocalTTFT, p.LocalQueue) <= ttft
	localTPOT := p.Streams == 0 || p.LocalStall <= StallBudget(p.Output, tpot)
	inLocal := localTTFT && localTPOT
	switch {
	case inLocal && inRemote:
		return router.Decision{Remote: p.RemoteTTFT < LocalCost(p, ttft, tpot), Reason: Cheaper}
	case inRemote:
		if localTTFT {
			return router.Decision{Remote: true, Reason: Stall}
		}
		return router.Decision{Remote: true, Reason: WithinSLO}
	case inLocal:
		if p.RemoteTTFT <= ttft {
			return router.Decision{Remote: false, Reason: Margin}
		}
		return router.Decision{Remote: false, Reason: WithinSLO}
	}
	return router.Decision{Remote: p.RemoteTTFT < p.LocalTTFT, Reason: Sooner}
}

// Estimate prices in's request on its decode and on the cheapest of its
// free prefill engines. ok is false when the metrics do not allow it: the
// decode's are stale, every free prefill's are, or no prefill cost has been
// measured on either side.
func Estimate(in router.DecideInput) (p Price, ok bool) {
	dec := in.Decode
	if !dec.Scraped {
		return Price{}, false
	}
	n := in.Req.PromptTokens
	u := n
	if in.Req.BlockSize > 0 {
		u = max(n-dec.PrefixBlocks*in.Req.BlockSize, 0)
	}
	// seat is the decode's wait before it runs a request: its measured
	// queue while requests wait there, or its remote legs' recent wait,
	// whichever is larger.
	seat := dec.DecodeQueueSeconds
	if dec.Waiting > 0 {
		seat = max(seat, dec.QueueSeconds)
	}
	// leg is the remote path's decode leg after the seat: the KV pull and
	// the first step after it.
	pull := float64(u) * dec.TransferSecondsPerToken
	if dec.PullCurve.Measured() {
		pull = dec.PullCurve.Seconds(u)
	}
	first := dec.FirstStepSeconds
	if first <= 0 {
		first = dec.ITLSeconds
	}
	leg := pull + first
	p.Prefill = -1
	var best cost
	for i, pre := range in.Prefill {
		if !pre.Scraped {
			continue
		}
		c, measured := costOf(pre)
		if !measured {
			if c, measured = costOf(dec); !measured {
				continue
			}
		}
		waitP := c.queue(pre)
		if pre.Waiting > 0 {
			waitP = max(waitP, pre.QueueSeconds)
		}
		remote := seat + waitP + c.seconds(n) + leg
		if p.Prefill < 0 || remote < p.RemoteTTFT {
			p.RemoteTTFT, p.RemoteQueue, p.Prefill, best = remote, seat+waitP, i, c
		}
	}
	if p.Prefill < 0 {
		return Price{}, false
	}
	cD, measured := costOf(dec)
	if !measured {
		cD = best
	}
	p.LocalStall = cD.seconds(u)
	wD := max(seat, cD.queue(dec))
	p.LocalTTFT, p.LocalQueue = wD+p.LocalStall, wD
	p.Streams, p.Output = int(max(dec.InFlight-1, 0)), in.Req.MaxTokens
	return p, true
}

// cost is an engine's prefill cost: its curve fitted to the proxy's legs,
// else a per-token cost (perToken).
type cost struct {
	curve    router.Curve
	perToken float64
}

// costOf is e's prefill cost: its leg-measured curve, else its scraped
// seconds per token; measured is false with neither.
func costOf(e router.Endpoint) (c cost, measured bool) {
	if e.PrefillCurve.Measured() {
		return cost{curve: e.PrefillCurve}, true
	}
	return cost{perToken: e.PrefillSecondsPerToken}, e.PrefillSecondsPerToken > 0
}

// seconds is the cost of prefilling n tokens.
func (c cost) seconds(n int) float64 {
	if c.curve.Measured() {
		return c.curve.Seconds(n)
	}
	return float64(n) * c.perToken
}

// queue is e's prefill queue priced at c: when both are e's leg-measured
// curve, the proxy's leg-measured work in flight on e
// (Endpoint.PrefillQueueSeconds); else the prompt tokens in flight there (a
// prefill engine's InFlightTokens, a decode's LocalPrefillTokens) at c, as
// one prompt.
func (c cost) queue(e router.Endpoint) float64 {
	if c.curve.Measured() && c.curve == e.PrefillCurve {
		return e.PrefillQueueSeconds
	}
	tokens := e.InFlightTokens
	if e.Role == "decode" {
		tokens = e.LocalPrefillTokens
	}
	if tokens <= 0 {
		return 0
	}
	return c.seconds(int(tokens))
}
