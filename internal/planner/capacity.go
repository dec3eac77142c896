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
	ttft, q         float64
	remoteFraction  float64
	prefillTooLong  float64
	// decodes is a decode engine's capacity by the decode pool's size (its
	// arrivals are smoother the more engines share them).
	decodes map[int]decodeCapacity
	// stalls is what the local prefills cost the decodes' streams.
	stalls *stalls
	// tpotRate is the rate a decode's TPOT side allows (-1 until found).
	tpotRate float64
}

// decodeCapacity is what one of d decode engines serves within the
// objectives: rate requests/s at batch and tpot (ms, stretched by its
// local prefills); limit is the objective that bounds it: "tpot", or
// "ttft" when its local prefills would queue past the TTFT objective at a
// higher rate.
type decodeCapacity struct {
	rate, batch, tpot float64
	limit             string
}

// model turns a fit into rates at a threshold: the prefill pool's per
// engine at P (only the prompts of at least threshold uncached tokens reach
// it) and a decode engine's, which prefills the others itself. At
// colocatedThreshold every prompt is local: the colocated split.
func (pl *Planner) model(f Fit, threshold int) *capacity {
	m := &capacity{f: f, cfg: &pl.cfg, ttft: pl.cfg.TTFT.Seconds(), q: math.Sqrt(pl.cfg.Goal), over: f.Overhead,
		decodes: map[int]decodeCapacity{}, tpotRate: -1}
	var lens, prefills []float64
	reqs := sample(pl.win, maxModelRequests)
	step := f.stepSeconds()
	chunk := float64(max(f.MaxBatchedTokens, 1))
	for _, r := range reqs {
		sv := f.PrefillSecondsPerToken * float64(r.UncachedTokens)
		switch {
		case r.UncachedTokens >= threshold:
			m.services = append(m.services, sv)
			lens = append(lens, float64(r.UncachedTokens))
		case r.UncachedTokens > 0:
			m.local = append(m.local, sv+math.Ceil(float64(r.UncachedTokens)/chunk)*step)
			prefills = append(prefills, sv)
			m.localPerRequest += sv
		}
	}
	n := float64(len(reqs))
	m.remoteFraction = float64(len(m.services)) / n
	m.localFraction = float64(len(m.local)) / n
	m.localPerRequest /= n
	if len(prefills) > 0 {
		m.stalls = newStalls(prefills, reqs, f.PrefillSecondsPerToken*chunk)
	}
	if len(m.services) > 0 {
		m.s = Mean(m.services)
		if m.s > 0 {
			sd := f.PrefillSecondsPerToken * StdDev(lens)
			m.cv2 = sd * sd / (m.s * m.s)
		}
	}
	return m
}

// stepSeconds is a decode step's time at the window's mean batch.
func (f Fit) stepSeconds() float64 { return (f.StepA + f.StepB*f.MeanBatch) / 1000 }

// decode is one of d decode engines' capacity. Its local prefills bound
// it twice: their time stretches its steps (decodeRateWithLocal), and they
// queue on it for their first token like prompts on a prefill engine
// (PrefillBusy, its arrivals one d-th of the pool's).
func (m *capacity) decode(d int) decodeCapacity {
	if c, ok := m.decodes[d]; ok {
		return c
	}
	maxRate := math.Inf(1)
	if len(m.local) > 0 && m.localFraction > 0 {
		mean := Mean(m.local)
		var cv2 float64
		if mean > 0 {
			sd := StdDev(m.local)
			cv2 = sd * sd / (mean * mean)
		}
		rho, _ := PrefillBusy(m.local, mean, 1/float64(max(d, 1)), cv2, 0, m.ttft, m.q)
		maxRate = 0
		if mean > 0 {
			maxRate = rho / (mean * m.localFraction)
		}
	}
	c := decodeCapacity{limit: "tpot"}
	c.rate, c.batch, c.tpot = m.decodeRateWithLocal(maxRate)
	if c.rate >= maxRate*(1-1e-6) {
		c.limit = "ttft"
	}
	m.decodes[d] = c
	return c
}

// decodeRateWithLocal is the requests/s a decode engine serves when each
// request also costs it localPerRequest seconds of prefill on average (the
// prompts under the threshold): at λ requests/s it spends ρ =
// λ·localPerRequest of its time prefilling, which stretches its steps to
// step/(1−ρ). Its step (its batch) is the largest that meets the TPOT
// objective·(1−ρ) and leaves no more than 1 − q of its streams missing the
// objective through the local prefills they wait (stalls.missed); λ is the
// largest rate with λ ≤ that batch's rate (Little's law at the stretched
// step), and at most maxRate. batch and tpot (ms, stretched) are at that
// rate.
func (m *capacity) decodeRateWithLocal(maxRate float64) (rate, batch, tpot float64) {
	f, local := m.f, m.localPerRequest
	slo := m.cfg.TPOT.Seconds()
	at := func(lambda float64) (r, k, t float64) {
		rho := lambda * local
		if rho >= 1 {
			return 0, 0, 0
		}
		step := slo * (1 - rho) // s
		missed := func(step float64) bool { return m.stalls.missed(lambda*m.localFraction, rho, step, slo) > 1-m.q }
		if missed(step) {
			// A stream's step is at least a batch of one's.
			lo, hi := (f.StepA+f.StepB)/1000, step
			if lo >= hi || missed(lo) {
				return 0, 0, 0
			}
			for range 12 {
				if mid := (lo + hi) / 2; missed(mid) {
					hi = mid
				} else {
					lo = mid
				}
			}
			step = lo
		}
		k = DecodeBatchAtSLO(f.StepA, f.StepB, f.StepSigma, 1000*step, m.q, m.cfg.MaxSeqs)
		if k <= 0 {
			return 0, 0, 0
		}
		t = (f.StepA + f.StepB*k) / (1 - rho)
		return DecodeRate(k, t/1000, f.MeanOutput), k, t
	}
	if local <= 0 {
		r, k, t := at(0)
		return min(r, maxRate), k, t
	}
	// The rate the TPOT side allows does not depend on maxRate: found
	// once per model, then capped.
	if m.tpotRate < 0 {
		m.tpotRate = m.searchRate(at)
	}
	lo := min(m.tpotRate, maxRate)
	_, batch, tpot = at(lo)
	return lo, batch, tpot
}

// searchRate is the largest λ with at(λ)'s rate ≥ λ, below 1/local (where
// local prefills take all the engine's time).
func (m *capacity) searchRate(at func(float64) (r, k, t float64)) float64 {
	lo, hi := 0.0, 1/m.localPerRequest
	for range 40 {
		if lo == hi {
			break
		}
		mid := (lo + hi) / 2
		if r, _, _ := at(mid); r >= mid {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// best is the split of cfg.Engines with at least one prefill engine with
// the most predicted goodput, the fewest prefill engines on a tie (the
// colocated split, none, is colocatedBest's). The prefill side, P·rate at
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

// prefillRate is what one of p prefill engines serves within the TTFT
// SLO's share of the goal (requests/s of the remote prompts).
func (m *capacity) prefillRate(p int) float64 {
	if m.s <= 0 {
		return math.Inf(1)
	}
	rho, tooLong := PrefillBusy(m.services, m.s, 1/float64(max(p, 1)), m.cv2, m.over, m.ttft, m.q)
	m.prefillTooLong = tooLong
	return rho / m.s
}

// split is p prefill and d decode engines' predicted goodput: the
// requests/s both pools sustain, the prefill pool seeing only the remote
// fraction of them (none with no prefill engine: then every prompt must be
// local, or the split serves nothing).
func (m *capacity) split(p, d int) Split {
	pre := math.Inf(1)
	switch {
	case m.remoteFraction > 0 && p == 0:
		pre = 0
	case m.remoteFraction > 0:
		pre = float64(p) * m.prefillRate(p) / m.remoteFraction
	}
	dec := 0.0
	if d > 0 {
		dec = float64(d) * m.decode(d).rate
	}
	s := Split{P: p, D: d, Goodput: min(pre, dec), Limit: "decode"}
	if pre < dec {
		s.Limit = "prefill"
	}
	return s
}

func (m *capacity) unattainable(d int) string {
	switch c := m.decode(max(d, 1)); {
	case c.rate <= 0 && c.limit == "ttft":
		return "the decode engines' own prefills miss the TTFT objective at any load"
	case c.rate <= 0:
		return "the decode engines miss the TPOT objective at every batch"
	case m.prefillTooLong > 0:
		return fmt.Sprintf("%.0f%% of the remote prompts take longer than the TTFT objective to prefill alone", 100*m.prefillTooLong)
	}
	return "the prefill engines miss the TTFT objective at any load"
}
