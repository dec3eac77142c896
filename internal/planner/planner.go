package planner

import (
	"errors"
	"fmt"
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
	// MinPrefill + MinDecode and 2.
	Engines int
	// Prefill is the split's prefill engines at start (the rest decode).
	// Default MinPrefill.
	Prefill int
	// MinPrefill and MinDecode bound the split. MinPrefill defaults to 0:
	// the split may be colocated, every engine a decode prefilling its own
	// prompts (the router must then keep every prompt local with no
	// prefill engine, as the conditional decider does); set 1 to keep a
	// prefill pool. MinDecode defaults to 1.
	MinPrefill, MinDecode int
	// MaxSeqs is the decode engines' --max-num-seqs. Default 64.
	MaxSeqs int
	// MaxBatchedTokens is the decode engines' --max-num-batched-tokens,
	// the chunk their local prefills are computed in. Default 2048 (tandem
	// serve's).
	MaxBatchedTokens int
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
	c.MinPrefill, c.MinDecode = max(c.MinPrefill, 0), max(c.MinDecode, 1)
	if c.Engines < max(c.MinPrefill+c.MinDecode, 2) {
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
	defInt(&c.MaxBatchedTokens, 2048)
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
	pl.cfg.Engines = max(n, pl.cfg.MinPrefill+pl.cfg.MinDecode, 2)
	pl.prefill = min(max(pl.prefill, pl.cfg.MinPrefill), pl.cfg.Engines-pl.cfg.MinDecode)
}

// Decision is what Decide chose and the numbers behind it.
type Decision struct {
	At time.Time `json:"at"`
	// Prefill and Decode are the split to run now.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	// Best is the split the model predicts the most goodput for; the
	// current split moves toward it one engine per change. Best.P 0 is the
	// colocated split: every engine a decode prefilling its own prompts.
	Best Split `json:"best"`
	// Threshold is the conditional decider's threshold to use (uncached
	// prompt tokens) while there is a prefill pool; with none every
	// prompt is local.
	Threshold int `json:"threshold_tokens"`
	// PrefillScheduleInterval is the prefill cadence advised for engines
	// that prefill beside their decodes (tandem serve
	// --prefill-schedule-interval).
	PrefillScheduleInterval int `json:"prefill_schedule_interval"`
	// Changed says the split changed at this decision.
	Changed bool `json:"changed"`
	// Crossed says the split goes to Best at once, more than one engine,
	// because the step toward it is predicted worse than now (a valley
	// between the colocated split and one with a prefill pool).
	Crossed bool `json:"crossed,omitempty"`
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
	// Limit is the side that bounds it: "prefill" or "decode" (see
	// Fit.DecodeLimit for the decode's objective).
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
	// MaxBatchedTokens is the decodes' prefill chunk (Config's).
	MaxBatchedTokens int `json:"max_batched_tokens"`
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
	// DecodeLimit is the objective that bounds a decode engine of the
	// current split: "tpot" (its batch and its local prefills' stalls), or
	// "ttft" (its local prefills would queue past it).
	DecodeLimit string `json:"decode_limit,omitempty"`

	// Current is the current split's predicted goodput.
	Current Split `json:"current"`
	// Unattainable says why no split meets the objectives, when none does.
	Unattainable string `json:"unattainable,omitempty"`
}

// Decide refits the model to the window ending at now and returns the
// split, threshold and cadence to run. The split changes only when the
// best split's predicted goodput beats the current one's by
// Config.Hysteresis and Config.MinDwell has passed since the last change,
// by one engine per call (or straight to the best across a valley, see
// Decision.Crossed); with too few fresh samples it holds. The best split
// may have no prefill engine (the colocated split) unless
// Config.MinPrefill keeps one.
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
	// the best split with a prefill pool, and the threshold whose best
	// split predicts the most goodput, unless the current threshold's is
	// within the hysteresis. The colocated split (no prefill engine) has
	// no threshold: it is weighed against that best.
	m := pl.model(f, pl.threshold)
	if th, mt := pl.bestThreshold(f, m.best(pl.cfg).Goodput); mt != nil {
		pl.threshold, m = th, mt
	}
	d.Threshold = pl.threshold
	d.Best = m.best(pl.cfg)
	var colo *capacity
	if pl.cfg.MinPrefill == 0 {
		colo = pl.model(f, colocatedThreshold)
		if c := colo.split(0, pl.cfg.Engines); c.Goodput >= d.Best.Goodput*(1-1e-9) {
			d.Best = c
		}
	}
	running := m // the model of the split running now
	if pl.prefill == 0 && colo != nil {
		running = colo
	}
	d.Fit.Current = running.split(pl.prefill, pl.cfg.Engines-pl.prefill)
	if d.Best.Goodput <= d.Fit.Current.Goodput*(1+1e-9) {
		d.Best = d.Fit.Current
	}
	d.Fit.RemoteFraction = running.remoteFraction
	d.Fit.PrefillSeconds, d.Fit.PrefillCV2, d.Fit.PrefillTooLong = m.s, m.cv2, m.prefillTooLong
	dc := running.decode(max(pl.cfg.Engines-pl.prefill, 1))
	d.Fit.DecodeBatch, d.Fit.DecodeTPOT, d.Fit.DecodeRate, d.Fit.DecodeLimit = dc.batch, dc.tpot, dc.rate, dc.limit
	if d.Best.Goodput <= 0 {
		d.Fit.Unattainable = m.unattainable(pl.cfg.Engines - pl.prefill)
	}
	d.PrefillScheduleInterval = pl.chooseCadence(f, running)
	// The split moves one engine toward Best per change, but not where
	// that step is predicted worse than now: the colocated split and the
	// best with a prefill pool may lie on either side of a valley (both
	// better than the splits between), and crossing it engine by engine
	// would lose goodput at every step and hold the split in the valley
	// for a dwell each. Across a valley the split goes to Best at once
	// (the proxy still moves engines one at a time).
	cur := d.Fit.Current.Goodput
	target := d.Best
	next := pl.prefill + 1
	if target.P < pl.prefill {
		next = pl.prefill - 1
	}
	sm := m
	if next == 0 {
		sm = colo
	}
	if target.P != pl.prefill && cur > 0 && sm.split(next, pl.cfg.Engines-next).Goodput < cur*(1-1e-9) {
		next, d.Crossed = target.P, true
	}
	switch {
	case target.P == pl.prefill:
	case target.Goodput < cur*(1+pl.cfg.Hysteresis):
		d.Held = fmt.Sprintf("hysteresis: %dP:%dD is predicted %.2f req/s against %.2f now, less than %.0f%% more",
			target.P, target.D, target.Goodput, cur, 100*pl.cfg.Hysteresis)
	case !pl.lastChange.IsZero() && now.Sub(pl.lastChange) < pl.cfg.MinDwell:
		d.Held = fmt.Sprintf("dwell: the split changed %v ago, less than %v", now.Sub(pl.lastChange).Round(time.Second), pl.cfg.MinDwell)
	default:
		pl.prefill = next
		pl.lastChange, d.Changed = now, true
	}
	if !d.Changed {
		d.Crossed = false
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
	f.MaxBatchedTokens = pl.cfg.MaxBatchedTokens
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
