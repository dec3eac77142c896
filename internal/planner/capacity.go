package planner

import (
	"fmt"
	"math"
)

// colocatedThreshold is the threshold of the colocated split (no prefill
// engine): no prompt reaches it, every decode prefills its own.
const colocatedThreshold = math.MaxInt

// capacity is the model fitted to a window at one threshold.
type capacity struct {
	f   Fit
	cfg *Config
	// services are the remote prompts' prefill times (s); s and cv2 their
	// mean and squared coefficient of variation, over the KV transfer's.
	services     []float64
	s, cv2, over float64
	// local are the local prompts' times to their first token on an idle
	// decode (their prefill and the decode steps its chunks share), and
	// localFraction the share of the requests they are. localPerRequest is
	// the prefill seconds a decode spends per request it serves (0 for the
	// remote ones), which its running streams wait through.
	local           []float64
	localFraction   float64
	localPerRequest float64
	// localMean and localCV2 are the local times' mean and squared
	// coefficient of variation; residualChunk is the mean residual of a
	// local prefill chunk found under way (E[c²]/2E[c], s).
	localMean, localCV2, residualChunk float64
	// n is how many requests the model stands for, cached how many of them
	// have no uncached token (their first token is a decode step).
	n, cached      float64
	ttft, goal     float64
	remoteFraction float64
	prefillTooLong float64
	// stalls is what the local prefills cost the decodes' streams.
	stalls *stalls
	// splits are the splits valued so far (P, D → their valuation), and
	// tpotCap a decode's capacity within the TPOT objective (nil until
	// found).
	splits  map[[2]int]valued
	tpotCap *decodeCapacity
	// spread is the variance of a stream's mean batch over its life per
	// unit of mean batch, for streams at the outputs' quantiles
	// (lifeSpread); spreadMean their mean.
	spread     []float64
	spreadMean float64
	// held is, for the same streams, the share of a burst's streams beside
	// each over its life when a burst fills the decode at once
	// (burstHeld).
	held []float64
}

// valued is a split's valuation: its Split, and one of its decode
// engines at that goodput.
type valued struct {
	s   Split
	dec decodeCapacity
}

// decodeCapacity is one of a split's decode engines: rate requests/s
// within the TPOT objective alone, at batch and tpot (ms, stretched by its
// local prefills); limit is the objective whose misses bound the split's
// goodput on it, "tpot" or "ttft".
type decodeCapacity struct {
	rate, batch, tpot float64
	limit             string
}

// model turns a fit into rates at a threshold: the prefill pool's per
// engine at P (only the prompts of at least threshold uncached tokens reach
// it) and a decode engine's, which prefills the others itself. At
// colocatedThreshold every prompt is local: the colocated split. A
// prompt's prefill is priced by the fitted curve (Fit.Prefill), a local
// one's in chunks of the decodes' --max-num-batched-tokens, each chunk a
// step of its own (the curve's fixed cost again) shared with the decodes.
func (pl *Planner) model(f Fit, threshold int) *capacity {
	m := &capacity{f: f, cfg: &pl.cfg, ttft: pl.cfg.TTFT.Seconds(), goal: pl.cfg.Goal, over: f.Overhead,
		splits: map[[2]int]valued{}}
	var prefills []float64
	var chunkSum, chunkSq float64
	cv := f.prefill()
	reqs := sample(pl.win, maxModelRequests)
	step := f.stepSeconds()
	chunk := float64(max(f.MaxBatchedTokens, 1))
	for _, r := range reqs {
		n := float64(r.UncachedTokens)
		switch {
		case r.UncachedTokens >= threshold:
			m.services = append(m.services, cv.Seconds(n))
		case r.UncachedTokens > 0:
			chunks := math.Ceil(n / chunk)
			sv := cv.Seconds(n) + (chunks-1)*cv.A
			m.local = append(m.local, sv+chunks*step)
			// The running streams' tokens ride in the chunks' steps:
			// they wait through what the chunks add to the steps they
			// would have run anyway.
			prefills = append(prefills, max(sv-chunks*step, 0))
			m.localPerRequest += sv
			c := sv / chunks
			chunkSum += sv
			chunkSq += chunks * c * c
		default:
			m.cached++
		}
	}
	outputs := make([]float64, len(reqs))
	for i, r := range reqs {
		outputs[i] = float64(r.OutputTokens)
	}
	m.spread = lifeSpread(outputs)
	m.held = burstHeld(outputs)
	m.spreadMean = Mean(m.spread)
	n := float64(len(reqs))
	m.n = n
	m.remoteFraction = float64(len(m.services)) / n
	m.localFraction = float64(len(m.local)) / n
	m.localPerRequest /= n
	if chunkSum > 0 {
		m.residualChunk = chunkSq / (2 * chunkSum)
	}
	if len(prefills) > 0 {
		m.stalls = newStalls(prefills, reqs, cv.Seconds(chunk))
	}
	for _, sv := range m.services {
		if m.ttft-sv-m.over <= 0 {
			m.prefillTooLong++
		}
	}
	if len(m.services) > 0 {
		m.prefillTooLong /= float64(len(m.services))
		m.s = Mean(m.services)
		if m.s > 0 {
			sd := StdDev(m.services)
			m.cv2 = sd * sd / (m.s * m.s)
		}
	}
	if len(m.local) > 0 {
		m.localMean = Mean(m.local)
		if m.localMean > 0 {
			sd := StdDev(m.local)
			m.localCV2 = sd * sd / (m.localMean * m.localMean)
		}
	}
	return m
}

// arrivalCA2 is the squared coefficient of variation of the arrivals
// the queueing terms take: the measured index of dispersion, at least a
// Poisson stream's 1 (arrivals smoother than Poisson are taken as
// Poisson: a window's few bins say little below it). One of P engines
// sharing them sees 1/P of it (round-robin smoothing of a Poisson stream;
// a burst is shared by the P).
func (f Fit) arrivalCA2() float64 { return max(f.ArrivalDispersion, 1) }

// prefill is the curve a prefill is priced by: Fit.Prefill, or the
// scraped per-token cost for a Fit made without one.
func (f Fit) prefill() PrefillCurve {
	if f.Prefill.Source == "" {
		return PrefillCurve{B: f.PrefillSecondsPerToken, Source: "scraped"}
	}
	return f.Prefill
}

// stepSeconds is a decode step's time at the window's mean batch.
func (f Fit) stepSeconds() float64 { return f.stepMs(f.MeanBatch) / 1000 }

// best is the split of cfg.Engines with at least one prefill engine with
// the most predicted goodput, the fewest prefill engines on a tie (the
// colocated split, none, is Decide's). The prefill side, P·rate at
// P, grows with P and the decode side, D·rate, falls, so the best is at
// their crossing: a binary search for the first P whose prefill side
// reaches the decode side, then that P or the one before.
func (m *capacity) best(cfg Config) Split {
	lo, hi := max(cfg.MinPrefill, 1), cfg.Engines-cfg.MinDecode
	if lo > hi {
		return Split{}
	}
	for lo < hi {
		mid := (lo + hi) / 2
		if s := m.split(mid, cfg.Engines-mid); s.Limit == "decode" {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	best := m.split(lo, cfg.Engines-lo)
	if lo > max(cfg.MinPrefill, 1) {
		if s := m.split(lo-1, cfg.Engines-lo+1); best.Goodput <= s.Goodput*(1+1e-9) {
			best = s
		}
	}
	return best
}

// split is p prefill and d decode engines' predicted goodput: the largest
// arrival rate λ at which Config.Goal of the requests meet both objectives
// (attainment). The target is the requests', not each pool's nor each
// objective's: a threshold that sends only the long prompts remote may
// leave some of them late where the short ones kept local meet the TTFT
// objective, and one that sends every prompt is not credited for the short
// ones twice. Limit is the side whose misses bound it: "prefill" when the
// remote prompts are the most of those missing (or the prefill engines
// are saturated), "decode" otherwise.
func (m *capacity) split(p, d int) Split { return m.value(p, d).s }

// decode is one of the d decode engines of p prefill and d decode.
func (m *capacity) decode(p, d int) decodeCapacity { return m.value(p, d).dec }

func (m *capacity) value(p, d int) valued {
	if v, ok := m.splits[[2]int{p, d}]; ok {
		return v
	}
	v := m.valueSplit(p, d)
	m.splits[[2]int{p, d}] = v
	return v
}

func (m *capacity) valueSplit(p, d int) valued {
	v := valued{s: Split{P: p, D: d, Limit: "decode"}, dec: decodeCapacity{limit: "tpot"}}
	if d <= 0 {
		return v
	}
	if m.remoteFraction > 0 && p == 0 {
		v.s.Limit = "prefill"
		return v
	}
	// Beyond hi a pool is saturated: the prefill engines, the decodes'
	// own prefills, or their seats.
	hi := math.Inf(1)
	preCap := math.Inf(1)
	if m.remoteFraction > 0 && m.s > 0 {
		preCap = float64(p) / (m.remoteFraction * m.s)
	}
	if m.localPerRequest > 0 {
		hi = float64(d) / m.localPerRequest
	}
	if m.localFraction > 0 && m.localMean > 0 {
		hi = min(hi, float64(d)/(m.localFraction*m.localMean))
	}
	hi = min(hi, preCap)
	if math.IsInf(hi, 1) {
		hi = float64(d) * float64(m.cfg.MaxSeqs) / (max(m.f.MeanOutput-1, 1) * m.f.stepMs(1) / 1000)
	}
	hi *= 1 - 1e-9
	at := func(lambda float64) attained { return m.attainment(p, d, lambda) }
	lo := 0.0
	if a := at(0); a.met < m.goal {
		v.s.Limit, v.dec.limit = a.limit()
		return v
	}
	if at(hi).met >= m.goal {
		lo = hi
	} else {
		top := hi
		// To a part in 10⁵ of the rate: far below any lead a move needs
		// (Config.Hysteresis), and a third of the valuations of a fixed
		// 50 halvings.
		for i := 0; i < 50 && top-lo > 1e-5*top; i++ {
			mid := (lo + top) / 2
			if at(mid).met >= m.goal {
				lo = mid
			} else {
				top = mid
			}
		}
	}
	v.s.Goodput = lo
	a := at(min(lo*1.001+1e-9, hi))
	v.s.Limit, v.dec.limit = a.limit()
	if lo >= hi*(1-1e-6) && hi >= preCap*(1-1e-6) {
		v.s.Limit = "prefill"
	}
	objective := v.dec.limit
	v.dec = m.tpotCapacity()
	v.dec.limit = objective
	return v
}

// tpotCapacity is a decode engine's most within the TPOT objective alone:
// the largest rate at which Config.Goal of its streams meet it, and its
// batch and step (ms, stretched) there. limit is left to the caller.
func (m *capacity) tpotCapacity() decodeCapacity {
	if m.tpotCap != nil {
		return *m.tpotCap
	}
	ok := func(r float64) bool {
		var a attained
		a.batch, a.step, a.rho = m.steadyDecodeAt(r)
		return 1-m.tpotMiss(r, math.Inf(1), a) >= m.goal
	}
	hi := float64(m.cfg.MaxSeqs) / (max(m.f.MeanOutput-1, 1) * m.f.stepMs(1) / 1000)
	if m.localPerRequest > 0 {
		hi = min(hi, 1/m.localPerRequest)
	}
	lo := 0.0
	for range 50 {
		mid := (lo + hi) / 2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	c := decodeCapacity{rate: lo}
	batch, step, rho := m.steadyDecodeAt(lo)
	if batch <= float64(m.cfg.MaxSeqs) && rho < 1 {
		c.batch, c.tpot = batch, 1000*step/(1-rho)
	}
	m.tpotCap = &c
	return c
}

// attained is what attainment found at one arrival rate.
type attained struct {
	// met is the fraction of the requests that meet both objectives;
	// remoteMiss and localMiss the fractions of all the requests that
	// miss the TTFT objective among the remote and the local prompts, and
	// tpotMiss the fraction of the streams that miss the TPOT objective.
	met, remoteMiss, localMiss, tpotMiss float64
	// batch, step (s, unstretched) and rho are a decode engine's.
	batch, step, rho float64
}

// limit is the side and the decodes' objective whose misses are the most.
func (a attained) limit() (side, objective string) {
	side, objective = "decode", "tpot"
	if a.remoteMiss > a.localMiss+a.tpotMiss {
		side = "prefill"
	}
	if a.localMiss > a.tpotMiss {
		objective = "ttft"
	}
	return side, objective
}

// attainment is how the requests fare at p prefill and d decode engines
// when λ requests/s arrive. TTFT: the prefill engines and the decodes' own
// prefills are GI/G/1 queues (one of P or D engines sharing the
// arrivals, whose burstiness is the window's: Fit.arrivalCA2),
// PrefillBusy's tail approximation; a remote prompt's TTFT also
// counts its KV transfer and its decode leg (decodeLeg). TPOT: a decode
// carries the batch Little's law gives at its share of the rate, its step
// at that batch stretched by its local prefills' share ρ of its time; a
// stream misses when its steps' noise (the fit's residual) puts its mean
// past the objective or when the local prefills it waits through do
// (stalls.missed). The two are taken as independent.
func (m *capacity) attainment(p, d int, lambda float64) attained {
	perDecode := lambda / float64(d)
	var a attained
	a.batch, a.step, a.rho = m.decodeAt(perDecode, m.burstShare(d))
	var remoteMet, localMet float64
	if len(m.services) > 0 && p > 0 {
		rho := lambda * m.remoteFraction * m.s / float64(p)
		leg := m.legAt(a.batch, a.step, a.rho)
		remoteMet = queueMet(m.services, m.s, m.f.arrivalCA2()/float64(p), m.cv2, m.over+leg, m.ttft, rho)
	}
	if len(m.local) > 0 {
		rho := perDecode * m.localFraction * m.localMean
		localMet = queueMet(m.local, m.localMean, m.f.arrivalCA2()/float64(d), m.localCV2, 0, m.ttft, rho)
	}
	a.remoteMiss = (float64(len(m.services)) - remoteMet) / m.n
	a.localMiss = (float64(len(m.local)) - localMet) / m.n
	ttftMet := (remoteMet + localMet + m.cached) / m.n
	a.tpotMiss = m.tpotMiss(perDecode, m.burstShare(d), a)
	a.met = ttftMet * (1 - a.tpotMiss)
	return a
}

// decodeAt is a decode engine serving perDecode requests/s, at most most
// of them at once (its share of a burst, burstShare): its batch, step (s,
// unstretched) and its local prefills' share ρ of its time. A burst of
// the window's size fills the decode no further than its share of the
// burst, however fast it arrives: a level of the P/D experiment (60
// requests) never holds a decode of 2P:2D at more than 30 streams, where
// the sustained rate's batch (steadyDecodeAt) may pass its seats. Nor
// do its streams wait through more local prefills than the burst brings:
// the sustained rate's share ρ (its prefills arriving for as long as the
// streams live) is bounded by burstRho.
func (m *capacity) decodeAt(perDecode, most float64) (batch, step, rho float64) {
	batch, step, rho = m.steadyDecodeAt(perDecode)
	if batch > most {
		batch = max(most, 1)
		step = m.f.stepMs(batch) / 1000
		rho = min(rho, m.burstRho(most, step))
	}
	return batch, step, rho
}

// burstRho is the share of a decode's time its local prefills take over
// the life of a stream of one burst, when the decode serves most of the
// burst's requests at step seconds a step: the burst's local prefill work
// (most requests at localPerRequest seconds each, the remote ones 0)
// against that work and the stream's own steps. The sustained ρ takes the
// prefills as arriving for the whole of the streams' lives; a burst's
// arrive while they start (the P/D experiment's 60 requests in under two
// seconds, whose streams then decode for several more).
func (m *capacity) burstRho(most, step float64) float64 {
	work := most * m.localPerRequest
	if work <= 0 {
		return 0
	}
	return work / (work + max(m.f.MeanOutput-1, 1)*step)
}

// burstShare is the most requests one of d decode engines holds at once
// from one burst of the window's arrivals (Fit.BurstRequests over d);
// +Inf when the arrivals were not seen in bursts.
func (m *capacity) burstShare(d int) float64 {
	if m.f.BurstRequests <= 0 || d <= 0 {
		return math.Inf(1)
	}
	return float64(m.f.BurstRequests) / float64(d)
}

// steadyDecodeAt is a decode engine serving perDecode requests/s
// sustained: its batch
// (Little's law at its stretched step, which grows with the batch: a fixed
// point), its step (s, unstretched) and its local prefills' share ρ of its
// time. A rate its seats (Config.MaxSeqs) cannot carry gives a batch of
// MaxSeqs + 1.
func (m *capacity) steadyDecodeAt(perDecode float64) (batch, step, rho float64) {
	f := m.f
	rho = perDecode * m.localPerRequest
	if rho >= 1 {
		return float64(m.cfg.MaxSeqs + 1), f.stepMs(float64(m.cfg.MaxSeqs)) / 1000, 1
	}
	life := max(f.MeanOutput-1, 1) / (1 - rho) // steps a stream lives, stretched
	// The batch k is where Little's law k = rate·life·step(k) holds: the
	// least root of g(k) = rate·life·step(k) − k from k = 1, where g
	// falls (the step grows no faster than the batch).
	g := func(k float64) float64 { return perDecode*life*f.stepMs(k)/1000 - k }
	seats := float64(m.cfg.MaxSeqs)
	switch {
	case g(1) <= 0:
		batch = 1
	case g(seats) > 0:
		return seats + 1, f.stepMs(seats) / 1000, rho
	default:
		lo, hi := 1.0, seats
		for range 50 {
			if mid := (lo + hi) / 2; g(mid) > 0 {
				lo = mid
			} else {
				hi = mid
			}
		}
		batch = hi
	}
	return batch, f.stepMs(batch) / 1000, rho
}

// tpotMiss is the fraction of a decode's streams that miss the TPOT
// objective at a, its batch at most most: those whose mean batch over
// their lives puts their mean step past it (stepMiss) and those the local
// prefills they wait through do (stalls.missed).
func (m *capacity) tpotMiss(perDecode, most float64, a attained) float64 {
	slo := m.cfg.TPOT.Seconds()
	if a.batch > float64(m.cfg.MaxSeqs) || a.rho >= 1 {
		return 1
	}
	noise := m.stepMiss(a.batch, most, slo)
	local, step := math.Inf(1), a.step // the local prefills a stream may meet, its steps
	if !math.IsInf(most, 1) {
		local = most * m.localFraction
		if len(m.held) > 0 && a.batch > 1 && a.batch >= most*(1-1e-9) {
			// Held by a burst, the batch falls as its streams finish
			// (stepMiss): a stream's slack is at the mean step it sees.
			step = m.f.stepMs(max(a.batch*Mean(m.held), 1)) / 1000
		}
	}
	stall := m.stalls.missed(perDecode*m.localFraction, a.rho, step, slo, local)
	return min(noise+stall, 1)
}

// decodeLeg is what a remote prompt's decode leg adds to its TTFT on one
// of d decode engines serving perDecode requests/s each (s).
func (m *capacity) decodeLeg(perDecode float64, d int) float64 {
	return m.legAt(m.decodeAt(perDecode, m.burstShare(d)))
}

// legAt is the decode leg on a decode engine at batch, step (s) and local
// prefill share ρ: the KV arrives while the engine is in a step, which the
// prompt waits out (the residual of a decode step, or of a local prefill
// chunk for the share ρ of the time the engine prefills), then its own
// first step, stretched by ρ.
func (m *capacity) legAt(batch, step, rho float64) float64 {
	if rho >= 1 || batch > float64(m.cfg.MaxSeqs) {
		return math.Inf(1)
	}
	return (1-rho)*step/2 + rho*m.residualChunk + step/(1-rho)
}

// queueMet is how many of the requests whose service times are services
// (mean s, squared coefficient of variation cv2; arrivals' ca2) wait at
// most slo − their service − overhead on a GI/G/1 server busy ρ of its
// time (PrefillBusy's tail approximation): a count, not a fraction.
func queueMet(services []float64, s, ca2, cv2, overhead, slo, rho float64) float64 {
	if rho >= 1 {
		return 0
	}
	c := (ca2 + cv2) / 2
	var total float64
	for _, sv := range services {
		if t := slo - sv - overhead; t > 0 {
			if s <= 0 || c <= 0 {
				total++
				continue
			}
			total += 1 - rho*math.Exp(-t*(1-rho)/(c*s))
		}
	}
	return total
}

// unattainable says why no split of p prefill and d decode engines meets
// the objectives even at no load.
func (m *capacity) unattainable(p, d int) string {
	a := m.attainment(max(p, 0), max(d, 1), 0)
	switch {
	case a.tpotMiss >= 1-m.goal:
		return "the decode engines miss the TPOT objective at every batch"
	case m.prefillTooLong > 0 && a.remoteMiss > a.localMiss:
		return fmt.Sprintf("%.0f%% of the remote prompts take longer than the TTFT objective to prefill alone", 100*m.prefillTooLong)
	case a.localMiss > 0:
		return "the decode engines' own prefills miss the TTFT objective at any load"
	}
	return "the prefill engines miss the TTFT objective at any load"
}
