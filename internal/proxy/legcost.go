package proxy

import (
	"sort"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
)

// Leg-measured costs. Every engine answer carries Server-Timing (queue,
// kv_pull, kv_ready, prefill: where the engine's part of its time to first
// token went) and usage (the prompt's tokens and how many of them were
// cached). From each prefill leg, and each decode leg whose prompt the
// decode prefilled itself, the proxy records the computed tokens and the
// prefill and queue seconds (observePrefillLeg), and fits the engine's
// prefill seconds for a prompt of n tokens, A + B·n + C·n², to its latest
// legs: a measure that needs no idle moment and no scrape window, so an
// engine busy without a break is priced from its own answers.

// Window of the fit.
const (
	// legWindow is how many of an engine's latest legs its curve is fitted
	// to.
	legWindow = 64
	// legMaxAge is the age beyond which a leg is left out of a new fit (the
	// curve fitted last stays until then: an idle engine keeps its price).
	legMaxAge = 2 * time.Minute
	// minCurveLegs and minCurveLengths are how many legs, and of how many
	// distinct lengths, the curve needs; with fewer it is per-token only
	// (B = the seconds over the tokens of the legs of at least
	// minCostTokens; unmeasured while there are none).
	minCurveLegs    = 8
	minCurveLengths = 3
	// legBookIdle is how long an engine's entry may see no leg and nothing
	// pending before a new engine's entry may drop it.
	legBookIdle = 10 * time.Minute
)

// prefillLeg is one leg's measurement: at is when its answer came (the end
// of its prefill, on the proxy's clock).
type prefillLeg struct {
	at             time.Time
	tokens         int
	prefill, queue float64
	local          bool
}

// legCost is one engine's costs as measured from the proxy's legs to it,
// and the prefills the proxy has sent it and not yet seen answered.
type legCost struct {
	mu    sync.Mutex
	legs  [legWindow]prefillLeg
	count int // legs recorded, up to legWindow
	next  int // where the next goes
	// curve is the fit to the legs at the last observation, perTokenOnly
	// whether it was the per-token fallback.
	curve        prefillCurve
	perTokenOnly bool
	// overlap is the engine's busy time per second of leg prefill in the
	// window: the union of the legs' prefill intervals over their sum (1
	// when they never overlap; 1/k when k prompts are computed side by
	// side in the same steps). A leg's prefill seconds are its latency;
	// overlap times them is the engine's work for it.
	overlap float64
	// pendN, pendTokens and pendSquares are the count, tokens and squared
	// tokens of the prefills sent to the engine and not yet answered.
	pendN, pendTokens, pendSquares float64
	// last is when the last leg was recorded.
	last time.Time
	// remote is a decode engine's latest remote legs (remoteWindow), in a
	// ring at remoteNext.
	remote      [remoteWindow]remoteLeg
	remoteCount int
	remoteNext  int
	// remoteQueue, remotePull and remoteFirst are remoteCosts at the last
	// remote leg.
	remoteQueue, remoteFirst float64
	remotePull               prefillCurve
}

// remoteWindow is how many of a decode's latest remote legs its decode-leg
// costs are the mean of.
const remoteWindow = 32

// remoteLeg is one remote decode leg's measurement: tokens pulled, its
// queue, its pull, and from the pull's end to the first token (kv_ready +
// prefill: the first step), in seconds.
type remoteLeg struct {
	at                 time.Time
	tokens             int
	queue, pull, first float64
}

// observeRemote records a remote decode leg.
func (lc *legCost) observeRemote(l remoteLeg) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.remote[lc.remoteNext] = l
	lc.remoteNext = (lc.remoteNext + 1) % remoteWindow
	lc.remoteCount = min(lc.remoteCount+1, remoteWindow)
	lc.last = l.at
	lc.remoteQueue, lc.remotePull, lc.remoteFirst = lc.remoteCosts()
}

// remoteCosts is a decode engine's decode-leg costs from its remote legs
// within legMaxAge of the newest: their mean queue and first step, and the
// pull's seconds by pulled tokens, fitted like the prefill curve (a pull
// has a fixed part: a ratio of sums would price a long pull at a short
// one's overhead per token). With too few legs or lengths for a fit, the
// pull is per token over the legs of at least minCostTokens, else their
// mean, fixed. All zero with no leg.
func (lc *legCost) remoteCosts() (queue float64, pull prefillCurve, first float64) {
	newest := time.Time{}
	for i := range lc.remoteCount {
		if lc.remote[i].at.After(newest) {
			newest = lc.remote[i].at
		}
	}
	var ns, ss []float64
	lengths := map[int]bool{}
	n, sum, longTokens, longPull := 0.0, 0.0, 0.0, 0.0
	for i := range lc.remoteCount {
		l := lc.remote[i]
		if newest.Sub(l.at) > legMaxAge {
			continue
		}
		n++
		queue += l.queue
		first += l.first
		sum += l.pull
		if l.tokens > 0 {
			ns, ss = append(ns, float64(l.tokens)), append(ss, l.pull)
			lengths[l.tokens] = true
		}
		if l.tokens >= minCostTokens {
			longTokens += float64(l.tokens)
			longPull += l.pull
		}
	}
	if n == 0 {
		return 0, prefillCurve{}, 0
	}
	switch {
	case len(ns) >= minCurveLegs && len(lengths) >= minCurveLengths:
		if c, ok := fitCurve(ns, ss); ok {
			pull = c
			break
		}
		fallthrough
	case longTokens > 0:
		pull = prefillCurve{B: longPull / longTokens}
	default:
		pull = prefillCurve{A: sum / n}
	}
	return queue / n, pull, first / n
}

// observe records a leg and refits.
func (lc *legCost) observe(l prefillLeg) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.legs[lc.next] = l
	lc.next = (lc.next + 1) % legWindow
	lc.count = min(lc.count+1, legWindow)
	lc.last = l.at
	lc.refit(l.at)
}

// refit fits the curve and the overlap to the legs within legMaxAge of now;
// with none it keeps the last.
func (lc *legCost) refit(now time.Time) {
	var ns, ss []float64
	type span struct{ from, to float64 }
	var spans []span
	lengths := map[int]bool{}
	secs, longTokens, longSecs := 0.0, 0.0, 0.0
	for i := range lc.count {
		l := lc.legs[i]
		if now.Sub(l.at) > legMaxAge || l.tokens <= 0 {
			continue
		}
		ns, ss = append(ns, float64(l.tokens)), append(ss, l.prefill)
		lengths[l.tokens] = true
		secs += l.prefill
		if l.tokens >= minCostTokens {
			longTokens += float64(l.tokens)
			longSecs += l.prefill
		}
		end := l.at.Sub(now).Seconds()
		spans = append(spans, span{end - l.prefill, end})
	}
	if len(ns) == 0 || secs <= 0 {
		return
	}
	if longSecs > 0 {
		// Per token over the legs of at least minCostTokens: a short
		// prompt's fixed costs (a step's overhead) are most of its time,
		// and would price a long one at its per-token rate.
		lc.perTokenOnly = true
		lc.curve = prefillCurve{B: longSecs / longTokens}
	}
	if len(ns) >= minCurveLegs && len(lengths) >= minCurveLengths {
		if c, ok := fitCurve(ns, ss); ok && c.measured() {
			lc.curve, lc.perTokenOnly = c, false
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].from < spans[j].from })
	busy, from, to := 0.0, spans[0].from, spans[0].to
	for _, s := range spans[1:] {
		if s.from > to {
			busy += to - from
			from, to = s.from, s.to
			continue
		}
		to = max(to, s.to)
	}
	busy += to - from
	lc.overlap = min(max(busy/secs, 0), 1)
}

// begin counts a prefill of tokens computed tokens as sent to the engine;
// the returned func counts it answered (once).
func (lc *legCost) begin(tokens int) (end func()) {
	n := float64(max(tokens, 0))
	lc.mu.Lock()
	lc.pendN++
	lc.pendTokens += n
	lc.pendSquares += n * n
	lc.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			lc.mu.Lock()
			lc.pendN--
			lc.pendTokens -= n
			lc.pendSquares -= n * n
			lc.mu.Unlock()
		})
	}
}

// legEstimate is what an engine's legs say of it now: its prefill curve
// (zero when unmeasured), the engine's work on the prefills the proxy has
// sent it and not yet seen answered (its prefill queue), and its remote
// decode legs' costs (remoteCosts), in seconds.
type legEstimate struct {
	curve        prefillCurve
	pending      float64
	queue, first float64
	pull         prefillCurve
}

// estimate is the engine's legEstimate.
func (lc *legCost) estimate() (e legEstimate) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	e.queue, e.pull, e.first = lc.remoteQueue, lc.remotePull, lc.remoteFirst
	c := lc.curve
	if !c.measured() {
		return e
	}
	work := c.A*lc.pendN + c.B*lc.pendTokens + c.C*lc.pendSquares
	e.curve, e.pending = c, max(work*lc.overlap, 0)
	return e
}

// fill sets e's leg-measured costs from base's legs (nothing when lb is
// nil: a backend made outside a pool).
func (lb *legBook) fill(e *router.Endpoint, base string) {
	if lb == nil {
		return
	}
	est := lb.engine(base).estimate()
	e.PrefillCurve = router.Curve{A: est.curve.A, B: est.curve.B, C: est.curve.C}
	e.PullCurve = router.Curve{A: est.pull.A, B: est.pull.B, C: est.pull.C}
	e.PrefillQueueSeconds = est.pending
	e.DecodeQueueSeconds, e.FirstStepSeconds = est.queue, est.first
}

// legBook is every engine's legCost by base URL, shared by the pools: an
// engine the planner moves to the other pool keeps what its legs measured
// (and its prefills in flight still count on it).
type legBook struct {
	mu      sync.RWMutex
	engines map[string]*legCost
}

func newLegBook() *legBook { return &legBook{engines: map[string]*legCost{}} }

// engine returns base's legCost, made on first use. Making one drops the
// entries of engines that saw no leg for legBookIdle and have nothing
// pending (engines gone from discovery).
func (lb *legBook) engine(base string) *legCost {
	lb.mu.RLock()
	lc := lb.engines[base]
	lb.mu.RUnlock()
	if lc != nil {
		return lc
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lc = lb.engines[base]; lc != nil {
		return lc
	}
	now := time.Now()
	for u, e := range lb.engines {
		e.mu.Lock()
		idle := e.pendN == 0 && !e.last.IsZero() && now.Sub(e.last) > legBookIdle
		e.mu.Unlock()
		if idle {
			delete(lb.engines, u)
		}
	}
	lc = &legCost{overlap: 1}
	lb.engines[base] = lc
	return lc
}

// observePrefillLeg records one prefill measured on the engine at url: a
// prefill leg's, or a decode leg's whose prompt the decode prefilled itself
// (local): tokens prompt tokens computed (the prompt less what the engine
// found cached), prefill the engine's compute from scheduling the request
// to its first token and queue its wait before that, both from the answer's
// Server-Timing. It feeds the engine's prefill curve.
func (p *Proxy) observePrefillLeg(url string, tokens int, prefill, queue time.Duration, local bool) {
	if tokens <= 0 || prefill <= 0 {
		return
	}
	p.legs.engine(url).observe(prefillLeg{at: time.Now(), tokens: tokens, prefill: prefill.Seconds(), queue: queue.Seconds(), local: local})
	p.observePlanPrefill(url, tokens, prefill, local)
}

// observeDecodeLeg records a remote decode leg's costs on the decode at url:
// tokens pulled (the proxy's estimate), its wait for a seat (queue), the KV
// pull, and from the pull's end to its first token (first), from the
// answer's Server-Timing.
func (p *Proxy) observeDecodeLeg(url string, tokens int, queue, pull, first time.Duration) {
	p.legs.engine(url).observeRemote(remoteLeg{at: time.Now(), tokens: tokens, queue: queue.Seconds(), pull: pull.Seconds(), first: first.Seconds()})
}
