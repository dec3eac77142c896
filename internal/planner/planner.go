package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Config configures a Planner. Zero values take the defaults on each field.
type Config struct {
	// TTFT and TPOT are the objectives. Both are required.
	TTFT, TPOT time.Duration
	// Goal is the fraction of requests that must meet both. Default 0.9.
	Goal float64
	// Engines is how many engines the split divides. Required, at least
	// MinPrefill + MinDecode.
	Engines int
	// Prefill is the split's prefill engines at start (the rest decode).
	// Default MinPrefill.
	Prefill int
	// MinPrefill and MinDecode bound the split. Default 1 each.
	MinPrefill, MinDecode int
	// MaxSeqs is the decode engines' --max-num-seqs. Default 64.
	MaxSeqs int
	// Window is how far back requests and engine samples are fitted.
	// Default 60s.
	Window time.Duration
	// MaxAge is the age beyond which an engine's scraped costs are stale
	// and ignored. Default 10s.
	MaxAge time.Duration
	// MinDwell is the least time between two changes of the split.
	// Default 30s.
	MinDwell time.Duration
	// Hysteresis is how much more goodput (a fraction) the model must
	// predict for a new split than for the current one before it moves.
	// Default 0.1.
	Hysteresis float64
	// MinRequests is the fewest requests in the window a decision is made
	// from. Default 20.
	MinRequests int
	// Threshold is the conditional decider's threshold at start (uncached
	// prompt tokens from which a prefill is remote). Default 256;
	// MinThreshold and MaxThreshold bound the chosen one (default 16 and
	// 4096).
	Threshold, MinThreshold, MaxThreshold int
	// MaxCadence bounds the prefill cadence chosen. Default 8.
	MaxCadence int
}

func (c *Config) setDefaults() error {
	if c.TTFT <= 0 || c.TPOT <= 0 {
		return errors.New("planner: both objectives are needed: set --slo-ttft and --slo-tpot")
	}
	if c.Goal <= 0 || c.Goal >= 1 {
		c.Goal = 0.9
	}
	c.MinPrefill, c.MinDecode = max(c.MinPrefill, 1), max(c.MinDecode, 1)
	if c.Engines < c.MinPrefill+c.MinDecode {
		return fmt.Errorf("planner: %d engines cannot be split into at least %d prefill and %d decode: start more engines", c.Engines, c.MinPrefill, c.MinDecode)
	}
	c.Prefill = min(max(c.Prefill, c.MinPrefill), c.Engines-c.MinDecode)
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Window, time.Minute)
	def(&c.MaxAge, 10*time.Second)
	def(&c.MinDwell, 30*time.Second)
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt(&c.MaxSeqs, 64)
	defInt(&c.MinRequests, 20)
	defInt(&c.Threshold, 256)
	defInt(&c.MinThreshold, 16)
	defInt(&c.MaxThreshold, 4096)
	defInt(&c.MaxCadence, 8)
	if c.Hysteresis <= 0 {
		c.Hysteresis = 0.1
	}
	return nil
}

// Request is one routed request as the router saw it.
type Request struct {
	// At is when it arrived.
	At time.Time
	// PromptTokens is its prompt's length, UncachedTokens the part its
	// decode did not hold cached, OutputTokens its expected output
	// (max_tokens).
	PromptTokens, UncachedTokens, OutputTokens int
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
}

// Planner is the pure decision logic: observations in, a Decision out.
// It is not safe for concurrent use; the caller serialises its calls.
type Planner struct {
	cfg        Config
	reqs       []Request
	samples    []EngineSample
	prefill    int
	threshold  int
	lastChange time.Time
}

// New returns a Planner whose split starts at cfg.Prefill prefill engines.
func New(cfg Config) (*Planner, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Planner{cfg: cfg, prefill: cfg.Prefill, threshold: cfg.Threshold}, nil
}

// Config is the planner's configuration with its defaults applied.
func (pl *Planner) Config() Config { return pl.cfg }

// ObserveRequest records a routed request.
func (pl *Planner) ObserveRequest(r Request) { pl.reqs = append(pl.reqs, r) }

// ObserveEngine records a scrape of an engine's costs.
func (pl *Planner) ObserveEngine(s EngineSample) { pl.samples = append(pl.samples, s) }

// SetEngines changes how many engines the split divides (an engine came or
// went); the split keeps its prefill count within the bounds.
func (pl *Planner) SetEngines(n int) {
	pl.cfg.Engines = max(n, pl.cfg.MinPrefill+pl.cfg.MinDecode)
	pl.prefill = min(max(pl.prefill, pl.cfg.MinPrefill), pl.cfg.Engines-pl.cfg.MinDecode)
}

// Decision is what Decide chose and the numbers behind it.
type Decision struct {
	At time.Time `json:"at"`
	// Prefill and Decode are the split to run now.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	// Best is the split the model predicts the most goodput for; the
	// current split moves toward it one engine per change.
	Best Split `json:"best"`
	// Threshold is the conditional decider's threshold to use (uncached
	// prompt tokens).
	Threshold int `json:"threshold_tokens"`
	// PrefillScheduleInterval is the prefill cadence advised for engines
	// that prefill beside their decodes (tandem serve
	// --prefill-schedule-interval).
	PrefillScheduleInterval int `json:"prefill_schedule_interval"`
	// Changed says the split changed at this decision.
	Changed bool `json:"changed"`
	// Held says why the split did not move to Best ("" when it is Best
	// or moved toward it): too few or stale samples, the dwell, or the
	// hysteresis.
	Held string `json:"held,omitempty"`
	Fit  Fit    `json:"fit"`
}

// Split is P prefill and D decode engines and the goodput the model
// predicts for them.
type Split struct {
	P       int     `json:"p"`
	D       int     `json:"d"`
	Goodput float64 `json:"goodput_rps"`
	// Limit is the side that bounds it: "prefill" or "decode".
	Limit string `json:"limit,omitempty"`
}

// Fit is the model refitted to the window: the traffic and the engines'
// costs.
type Fit struct {
	Requests       int     `json:"requests"`
	ArrivalRate    float64 `json:"arrival_rps"`
	MeanPrompt     float64 `json:"mean_prompt_tokens"`
	MeanUncached   float64 `json:"mean_uncached_tokens"`
	MeanOutput     float64 `json:"mean_output_tokens"`
	RemoteFraction float64 `json:"remote_fraction"`
	// FreshEngines and StaleSamples count the engines with a sample within
	// MaxAge and the samples of the window ignored as older.
	FreshEngines int `json:"fresh_engines"`
	StaleSamples int `json:"stale_samples"`

	PrefillSecondsPerToken float64 `json:"prefill_seconds_per_token"`
	PrefillSeconds         float64 `json:"prefill_seconds"`
	PrefillCV2             float64 `json:"prefill_cv2"`
	Overhead               float64 `json:"overhead_seconds"`
	PrefillTooLong         float64 `json:"prefill_too_long,omitempty"`

	// DecodeFit is "fit" (TPOT = A + B·k by least squares), "proportional"
	// (too few distinct batches: TPOT = B·k through the origin) or "".
	DecodeFit    string  `json:"decode_fit"`
	DecodePoints int     `json:"decode_points"`
	StepA        float64 `json:"tpot_ms_at_batch_0"`
	StepB        float64 `json:"tpot_ms_per_sequence"`
	StepSigma    float64 `json:"tpot_residual_ms"`
	MeanBatch    float64 `json:"mean_batch"`
	DecodeBatch  float64 `json:"decode_batch_at_slo"`
	DecodeTPOT   float64 `json:"decode_tpot_ms_at_batch"`
	DecodeRate   float64 `json:"decode_rate_rps"`

	// Current is the current split's predicted goodput.
	Current Split `json:"current"`
	// Unattainable says why no split meets the objectives, when none does.
	Unattainable string `json:"unattainable,omitempty"`
}

// Decide refits the model to the window ending at now and returns the
// split, threshold and cadence to run. The split changes at most one
// engine per call, only when the best split's predicted goodput beats the
// current one's by Config.Hysteresis and Config.MinDwell has passed since
// the last change; with too few fresh samples it holds.
func (pl *Planner) Decide(now time.Time) (d Decision) {
	pl.trim(now)
	d = Decision{At: now, Threshold: pl.threshold, PrefillScheduleInterval: 1}
	f, why := pl.fit(now)
	d.Fit = f
	defer func() { d.Prefill, d.Decode = pl.prefill, pl.cfg.Engines-pl.prefill }()
	if why != "" {
		d.Held, d.Best = why, Split{P: pl.prefill, D: pl.cfg.Engines - pl.prefill}
		return d
	}
	// The threshold and the split together: for each candidate threshold
	// the best split, and the threshold whose best split predicts the most
	// goodput, unless the current threshold's is within the hysteresis.
	m := pl.model(f, pl.threshold)
	cur := m.best(pl.cfg)
	if th, mt := pl.bestThreshold(f, cur.Goodput); mt != nil {
		pl.threshold, m = th, mt
	}
	d.Threshold = pl.threshold
	d.Fit.RemoteFraction = m.remoteFraction
	d.Fit.Current = m.split(pl.prefill, pl.cfg.Engines-pl.prefill)
	d.Best = m.best(pl.cfg)
	if d.Best.Goodput <= d.Fit.Current.Goodput*(1+1e-9) {
		d.Best = d.Fit.Current
	}
	d.Fit.PrefillSeconds, d.Fit.PrefillCV2, d.Fit.PrefillTooLong = m.s, m.cv2, m.prefillTooLong
	d.Fit.DecodeBatch, d.Fit.DecodeTPOT, d.Fit.DecodeRate = m.decodeBatch, m.decodeTPOT, m.decodeRate
	if d.Best.Goodput <= 0 {
		d.Fit.Unattainable = m.unattainable()
	}
	d.PrefillScheduleInterval = pl.chooseCadence(f, m)
	switch cur := d.Fit.Current.Goodput; {
	case d.Best.P == pl.prefill:
	case d.Best.Goodput < cur*(1+pl.cfg.Hysteresis):
		d.Held = fmt.Sprintf("hysteresis: %dP:%dD is predicted %.2f req/s against %.2f now, less than %.0f%% more",
			d.Best.P, d.Best.D, d.Best.Goodput, cur, 100*pl.cfg.Hysteresis)
	case !pl.lastChange.IsZero() && now.Sub(pl.lastChange) < pl.cfg.MinDwell:
		d.Held = fmt.Sprintf("dwell: the split changed %v ago, less than %v", now.Sub(pl.lastChange).Round(time.Second), pl.cfg.MinDwell)
	default:
		if d.Best.P > pl.prefill {
			pl.prefill++
		} else {
			pl.prefill--
		}
		pl.lastChange, d.Changed = now, true
	}
	return d
}

// trim drops what fell out of the window.
func (pl *Planner) trim(now time.Time) {
	from := now.Add(-pl.cfg.Window)
	pl.reqs = slices.DeleteFunc(pl.reqs, func(r Request) bool { return r.At.Before(from) })
	pl.samples = slices.DeleteFunc(pl.samples, func(s EngineSample) bool { return s.At.Before(from) })
}

// fit measures the traffic and the engines' costs over the window; why
// says what is missing when a decision cannot be made.
func (pl *Planner) fit(now time.Time) (f Fit, why string) {
	f.Requests = len(pl.reqs)
	if f.Requests < pl.cfg.MinRequests {
		return f, fmt.Sprintf("too few requests: %d in the last %v, need %d", f.Requests, pl.cfg.Window, pl.cfg.MinRequests)
	}
	var prompt, uncached, output float64
	for _, r := range pl.reqs {
		prompt += float64(r.PromptTokens)
		uncached += float64(r.UncachedTokens)
		output += float64(r.OutputTokens)
	}
	n := float64(f.Requests)
	f.MeanPrompt, f.MeanUncached, f.MeanOutput = prompt/n, uncached/n, output/n
	span := max(now.Sub(pl.reqs[0].At).Seconds(), 1)
	f.ArrivalRate = n / span

	var prefillCosts, transferCosts []float64
	var ks, tpots []float64
	fresh := map[string]bool{}
	for _, s := range pl.samples {
		if now.Sub(s.At) > pl.cfg.MaxAge {
			f.StaleSamples++
			continue
		}
		fresh[s.URL] = true
		if s.PrefillSecondsPerToken > 0 {
			prefillCosts = append(prefillCosts, s.PrefillSecondsPerToken)
		}
		if s.TransferSecondsPerToken > 0 {
			transferCosts = append(transferCosts, s.TransferSecondsPerToken)
		}
		if s.Decode && s.Running > 0 && s.ITLSeconds > 0 {
			ks = append(ks, s.Running)
			tpots = append(tpots, 1000*s.ITLSeconds)
		}
	}
	f.FreshEngines = len(fresh)
	if len(prefillCosts) == 0 {
		return f, fmt.Sprintf("stale or missing metrics: no engine measured a prefill cost in the last %v (%d older samples ignored)", pl.cfg.MaxAge, f.StaleSamples)
	}
	if len(ks) == 0 {
		return f, fmt.Sprintf("stale or missing metrics: no decode engine measured its inter-token latency in the last %v (%d older samples ignored)", pl.cfg.MaxAge, f.StaleSamples)
	}
	f.PrefillSecondsPerToken = median(prefillCosts)
	f.DecodePoints, f.MeanBatch = len(ks), Mean(ks)
	if a, b, sigma, ok := FitLine(ks, tpots); ok && len(ks) >= 3 && b > 0 && a >= 0 {
		f.DecodeFit, f.StepA, f.StepB, f.StepSigma = "fit", a, b, sigma
	} else {
		var per []float64
		for i := range ks {
			per = append(per, tpots[i]/ks[i])
		}
		f.DecodeFit, f.StepB = "proportional", median(per)
	}
	if len(transferCosts) > 0 {
		f.Overhead = median(transferCosts) * f.MeanUncached
	}
	return f, ""
}

// capacity is the model fitted to a window.
type capacity struct {
	services        []float64 // the remote prompts' prefill times (s)
	s, cv2, over    float64
	ttft, q         float64
	remoteFraction  float64
	decodeRate      float64
	decodeBatch     float64
	decodeTPOT      float64 // ms
	prefillTooLong  float64
	prefillPerToken float64
}

// model turns a fit into rates at a threshold: the prefill pool's per
// engine at P (only the prompts of at least threshold uncached tokens reach
// it) and a decode engine's, which prefills the others itself.
func (pl *Planner) model(f Fit, threshold int) *capacity {
	q := math.Sqrt(pl.cfg.Goal)
	m := &capacity{ttft: pl.cfg.TTFT.Seconds(), q: q, over: f.Overhead, prefillPerToken: f.PrefillSecondsPerToken}
	var lens []float64
	var local float64
	reqs := sample(pl.reqs, maxModelRequests)
	for _, r := range reqs {
		sv := f.PrefillSecondsPerToken * float64(r.UncachedTokens)
		if r.UncachedTokens >= threshold {
			m.services = append(m.services, sv)
			lens = append(lens, float64(r.UncachedTokens))
		} else {
			local += sv
		}
	}
	n := float64(len(reqs))
	m.remoteFraction = float64(len(m.services)) / n
	if len(m.services) > 0 {
		m.s = Mean(m.services)
		if m.s > 0 {
			sd := f.PrefillSecondsPerToken * StdDev(lens)
			m.cv2 = sd * sd / (m.s * m.s)
		}
	}
	m.decodeRate, m.decodeBatch, m.decodeTPOT = decodeRateWithLocal(f, local/n, pl.cfg.TPOT, q, pl.cfg.MaxSeqs)
	return m
}

// decodeRateWithLocal is the requests/s a decode engine serves when each
// request also costs it local seconds of prefill on average (the prompts
// under the threshold): at λ requests/s it spends ρ = λ·local of its time
// prefilling, which stretches its steps to tpot/(1−ρ), so its batch is the
// one whose step time meets the TPOT objective·(1−ρ), and λ is the largest
// rate with λ ≤ that batch's rate (Little's law at the stretched step).
// batch and tpot (ms, stretched) are at that rate.
func decodeRateWithLocal(f Fit, local float64, slo time.Duration, q float64, maxSeqs int) (rate, batch, tpot float64) {
	sloMS := float64(slo) / float64(time.Millisecond)
	at := func(lambda float64) (r, k, t float64) {
		rho := lambda * local
		if rho >= 1 {
			return 0, 0, 0
		}
		k = DecodeBatchAtSLO(f.StepA, f.StepB, f.StepSigma, sloMS*(1-rho), q, maxSeqs)
		t = (f.StepA + f.StepB*k) / (1 - rho)
		return DecodeRate(k, t/1000, f.MeanOutput), k, t
	}
	if local <= 0 {
		return at(0)
	}
	lo, hi := 0.0, 1/local // the rate at which local prefills take all its time
	for range 60 {
		mid := (lo + hi) / 2
		if r, _, _ := at(mid); r >= mid {
			lo = mid
		} else {
			hi = mid
		}
	}
	_, batch, tpot = at(lo)
	return lo, batch, tpot
}

// best is the split of cfg.Engines with the most predicted goodput, the
// fewest prefill engines on a tie. The prefill side, P·rate at P, grows
// with P and the decode side, D·rate, falls, so the best is at their
// crossing: a binary search for the first P whose prefill side reaches the
// decode side, then that P or the one before.
func (m *capacity) best(cfg Config) Split {
	lo, hi := cfg.MinPrefill, cfg.Engines-cfg.MinDecode
	for lo < hi {
		mid := (lo + hi) / 2
		if s := m.split(mid, cfg.Engines-mid); s.Limit == "decode" {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	best := m.split(lo, cfg.Engines-lo)
	if lo > cfg.MinPrefill {
		if s := m.split(lo-1, cfg.Engines-lo+1); best.Goodput <= s.Goodput*(1+1e-9) {
			best = s
		}
	}
	return best
}

// bestThreshold tries the thresholds that split the window's prompts
// differently (every distinct uncached length + 1, and the bounds) and
// returns the one whose best split predicts the most goodput, with its
// model, when that beats current (the current threshold's) by the
// hysteresis, or at once when the current threshold breaks the limits
// below; nil otherwise. A threshold above what one prompt may take to
// prefill within the TTFT objective is not tried, nor one whose local
// prefill would by itself push a stream it stalls past the TPOT objective:
// the model spreads local prefills over the decodes' steps as a mean, but
// one prefill lands on the streams running at that moment at once, and a
// stream has only (TPOT objective − its step time)·(mean output − 1) of
// slack.
func (pl *Planner) bestThreshold(f Fit, current float64) (int, *capacity) {
	limit := pl.cfg.MaxThreshold
	if f.PrefillSecondsPerToken > 0 {
		limit = min(limit, int((pl.cfg.TTFT.Seconds()-f.Overhead)/f.PrefillSecondsPerToken))
		step := (f.StepA + f.StepB*f.MeanBatch) / 1000
		slack := (pl.cfg.TPOT.Seconds() - step) * max(f.MeanOutput-1, 1)
		limit = min(limit, int(max(slack, 0)/f.PrefillSecondsPerToken))
	}
	cands := []int{pl.cfg.MinThreshold}
	for _, r := range sample(pl.reqs, maxModelRequests) {
		if l := r.UncachedTokens + 1; l > pl.cfg.MinThreshold && l <= limit {
			cands = append(cands, l)
		}
	}
	slices.Sort(cands)
	cands = slices.Compact(cands)
	if len(cands) > maxThresholds { // keep quantiles: each candidate costs a fit
		step := float64(len(cands)) / maxThresholds
		var kept []int
		for i := range maxThresholds {
			kept = append(kept, cands[int(float64(i)*step)])
		}
		cands = kept
	}
	bestTh, bestG := 0, current*(1+pl.cfg.Hysteresis)
	if pl.threshold > max(limit+1, pl.cfg.MinThreshold) {
		// The current threshold keeps prompts local that break the
		// limits: a hard constraint, not a matter of goodput (and the
		// decodes' step times, measured with those stalls in them, may
		// make every choice look unattainable).
		bestG = -1
	}
	var bestM *capacity
	for _, th := range cands {
		m := pl.model(f, th)
		if g := m.best(pl.cfg).Goodput; g > bestG {
			bestTh, bestG, bestM = th, g, m
		}
	}
	return bestTh, bestM
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
// fraction of them.
func (m *capacity) split(p, d int) Split {
	pre := math.Inf(1)
	if m.remoteFraction > 0 {
		pre = float64(p) * m.prefillRate(p) / m.remoteFraction
	}
	dec := float64(d) * m.decodeRate
	s := Split{P: p, D: d, Goodput: min(pre, dec), Limit: "decode"}
	if pre < dec {
		s.Limit = "prefill"
	}
	return s
}

func (m *capacity) unattainable() string {
	switch {
	case m.decodeRate <= 0:
		return "the decode engines miss the TPOT objective at every batch"
	case m.prefillTooLong > 0:
		return fmt.Sprintf("%.0f%% of the remote prompts take longer than the TTFT objective to prefill alone", 100*m.prefillTooLong)
	}
	return "the prefill engines miss the TTFT objective at any load"
}

// chooseCadence is the prefill cadence advised for engines that prefill
// beside their decodes: 1 (every step) while their TPOT has room, else as
// many steps as a local prompt can wait within its TTFT slack (TTFT
// objective less its own prefill at the threshold), so that prefills are
// gathered into fewer steps and fewer inter-token gaps carry one.
func (pl *Planner) chooseCadence(f Fit, m *capacity) int {
	tpot := (f.StepA + f.StepB*f.MeanBatch) / 1000
	if m.remoteFraction >= 1 || tpot <= 0 || tpot < 0.8*pl.cfg.TPOT.Seconds() {
		return 1
	}
	slack := pl.cfg.TTFT.Seconds() - f.PrefillSecondsPerToken*float64(pl.threshold)
	return min(max(int(slack/tpot), 1), pl.cfg.MaxCadence)
}

// Bounds on a decision's work, whatever the traffic: the model is fitted
// to at most maxModelRequests of the window's requests (evenly spread over
// it), and at most maxThresholds thresholds are tried. A decision then
// costs tens of milliseconds at 32 engines.
const (
	maxModelRequests = 256
	maxThresholds    = 16
)

// sample is at most n of rs, evenly spread.
func sample(rs []Request, n int) []Request {
	if len(rs) <= n {
		return rs
	}
	out := make([]Request, n)
	step := float64(len(rs)) / float64(n)
	for i := range out {
		out[i] = rs[int(float64(i)*step)]
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
