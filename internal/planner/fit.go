package planner

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Fit is the model refitted to the window: the traffic and the engines'
// costs.
type Fit struct {
	Requests int `json:"requests"`
	// Shift says why the model is fitted to the requests since a shift
	// of the traffic mix only ("" when it is fitted to the whole window).
	Shift       string  `json:"shift,omitempty"`
	ArrivalRate float64 `json:"arrival_rps"`
	// ArrivalDispersion is the index of dispersion of the arrivals'
	// counts in bins of the TTFT objective over the last
	// dispersionWindows windows (arrivalDispersion): 1 for
	// Poisson arrivals, more for bursts. The queueing terms take it (at
	// least 1) as the arrivals' squared coefficient of variation.
	ArrivalDispersion float64 `json:"arrival_dispersion"`
	// BurstRequests is the most requests of one burst in the arrivals of
	// the last dispersionWindows windows (those ArrivalDispersion is
	// measured over): arrivals with no gap longer than a stream's life
	// between them (the decodes drain in such a gap), 0 when they show no
	// such gap or are not bursty (ArrivalDispersion under
	// burstyDispersion): the traffic is then taken as sustained. The
	// window alone (a level of the P/D experiment while it arrives) shows
	// no burst's end. A decode's batch is at most its share of a burst, and
	// its streams wait through at most the burst's local prefills
	// (capacity.decodeAt).
	BurstRequests int     `json:"burst_requests,omitempty"`
	MeanPrompt    float64 `json:"mean_prompt_tokens"`
	MeanUncached  float64 `json:"mean_uncached_tokens"`
	MeanOutput    float64 `json:"mean_output_tokens"`
	// FinishedOutputs counts the requests whose output is what they
	// produced (the others' is their max_tokens).
	FinishedOutputs int     `json:"finished_outputs"`
	RemoteFraction  float64 `json:"remote_fraction"`
	// MaxBatchedTokens is the decodes' prefill chunk (Config's).
	MaxBatchedTokens int `json:"max_batched_tokens"`
	// FreshEngines and StaleSamples count the engines with a sample within
	// MaxAge and the samples of the window ignored as older.
	FreshEngines int `json:"fresh_engines"`
	StaleSamples int `json:"stale_samples"`
	// IdlePoints counts the decode points of engines idle now, from their
	// last busy scrapes however old.
	IdlePoints int `json:"idle_points,omitempty"`

	// PrefillSecondsPerToken is the engines' scraped prefill cost (the
	// median), Prefill the curve the model prices a prefill by: fitted
	// to the measured prefills (ObservePrefill) or, with too few, that
	// per-token cost.
	PrefillSecondsPerToken float64      `json:"prefill_seconds_per_token"`
	Prefill                PrefillCurve `json:"prefill_curve"`
	PrefillSeconds         float64      `json:"prefill_seconds"`
	PrefillCV2             float64      `json:"prefill_cv2"`
	Overhead               float64      `json:"overhead_seconds"`
	PrefillTooLong         float64      `json:"prefill_too_long,omitempty"`

	// DecodeFit is how the decode step curve TPOT = A + B·k^P ms was
	// fitted (decodecurve.go): "fit" (A, B and P by least squares, the
	// batches spanning enough), "prior" (the prior's shape scaled to
	// points from too narrow a range of batches) or "".
	DecodeFit    string  `json:"decode_fit"`
	DecodePoints int     `json:"decode_points"`
	StepA        float64 `json:"tpot_ms_at_batch_0"`
	StepB        float64 `json:"tpot_ms_per_sequence"`
	StepP        float64 `json:"tpot_batch_exponent"`
	StepSigma    float64 `json:"tpot_residual_ms"`
	// StepBatchMin and StepBatchMax are the range of batches the decode
	// points span. Past StepBatchMax the step is not the fitted curve's but
	// the step there grown as the prior's shape grows, or along the
	// curve's upper slope where that grows more (stepMs).
	StepBatchMin float64 `json:"observed_batch_min"`
	StepBatchMax float64 `json:"observed_batch_max"`
	// StepBSE is the standard error of StepB (ms) where A, B and P were
	// fitted ("fit"): StepSigma over the spread of the points' k^P, large
	// for a noisy fit over few batches; stepPivot is the points' mean k^P,
	// about which the curve turns within it (uncertainFit).
	StepBSE   float64 `json:"tpot_ms_per_sequence_se,omitempty"`
	stepPivot float64
	// DecodeLeg is what a remote prompt's decode leg adds to its TTFT at
	// the current split's predicted load (s): the wait for the decode's
	// step under way, then its first step.
	DecodeLeg   float64 `json:"decode_leg_seconds"`
	MeanBatch   float64 `json:"mean_batch"`
	DecodeBatch float64 `json:"decode_batch_at_slo"`
	DecodeTPOT  float64 `json:"decode_tpot_ms_at_batch"`
	DecodeRate  float64 `json:"decode_rate_rps"`
	// DecodeLimit is the objective that bounds a decode engine of the
	// current split: "tpot" (its batch and its local prefills' stalls), or
	// "ttft" (its local prefills would queue past it).
	DecodeLimit string `json:"decode_limit,omitempty"`

	// Current is the current split's predicted goodput.
	Current Split `json:"current"`
	// Unattainable says why no split meets the objectives, when none does.
	Unattainable string `json:"unattainable,omitempty"`
}

// fit measures the traffic and the engines' costs over the window; why
// says what is missing when a decision cannot be made.
func (pl *Planner) fit(now time.Time) (f Fit, why string) {
	win, from, shift := pl.view(now)
	pl.win, f.Shift = win, shift
	f.Requests = len(win)
	switch need := shiftSample(pl.cfg); {
	case shift != "" && f.Requests < need:
		// The shift was judged on as many: the new mix is known enough.
		return f, fmt.Sprintf("too few requests: %d since the traffic mix changed, need %d", f.Requests, need)
	case shift == "" && f.Requests < pl.cfg.MinRequests:
		return f, fmt.Sprintf("too few requests: %d in the last %v, need %d", f.Requests, pl.cfg.Window, pl.cfg.MinRequests)
	}
	var prompt, uncached, output float64
	for _, r := range win {
		prompt += float64(r.PromptTokens)
		uncached += float64(r.UncachedTokens)
		output += float64(r.OutputTokens)
		if r.Finished {
			f.FinishedOutputs++
		}
	}
	n := float64(f.Requests)
	f.MeanPrompt, f.MeanUncached, f.MeanOutput = prompt/n, uncached/n, output/n
	f.MaxBatchedTokens = pl.cfg.MaxBatchedTokens
	span := now.Sub(from).Seconds()
	if shift == "" {
		span = max(span, 1)
	}
	f.ArrivalRate = n / span
	if len(pl.arrivals) > 0 {
		f.ArrivalDispersion = arrivalDispersion(pl.arrivals, pl.arrivals[0].At, now, pl.cfg.TTFT)
	}

	var prefillCosts, transferCosts []float64
	var ks, tpots, chunks []float64
	fresh := map[string]bool{}
	latest := map[string]EngineSample{} // each engine's last fresh sample
	freshPoints := map[string]bool{}
	for _, s := range pl.samples {
		if now.Sub(s.At) > pl.cfg.MaxAge {
			f.StaleSamples++
			continue
		}
		fresh[s.URL] = true
		if l, ok := latest[s.URL]; !ok || !s.At.Before(l.At) {
			latest[s.URL] = s
		}
		if s.PrefillSecondsPerToken > 0 {
			prefillCosts = append(prefillCosts, s.PrefillSecondsPerToken)
		}
		if s.TransferSecondsPerToken > 0 {
			transferCosts = append(transferCosts, s.TransferSecondsPerToken)
		}
		if s.Decode && s.Running > 0 && s.ITLSeconds > 0 {
			ks = append(ks, s.Running)
			tpots = append(tpots, 1000*s.ITLSeconds)
			freshPoints[s.URL] = true
		}
		if s.Decode && s.MaxBatchedTokens > 0 {
			chunks = append(chunks, float64(s.MaxBatchedTokens))
		}
	}
	if len(chunks) > 0 { // the decodes say theirs
		f.MaxBatchedTokens = int(median(chunks))
	}
	// An idle decode engine decoded nothing to measure: its last points
	// stand (a busy one with none fresh is stale and left out).
	for _, url := range slices.Sorted(maps.Keys(latest)) {
		if s := latest[url]; s.Decode && s.Idle && !freshPoints[url] {
			for _, p := range pl.lastPoints[url] {
				ks = append(ks, p.Running)
				tpots = append(tpots, 1000*p.ITLSeconds)
				f.IdlePoints++
			}
		}
	}
	f.FreshEngines = len(fresh)
	f.PrefillSecondsPerToken = median(prefillCosts)
	f.Prefill = pl.prefillCurve(from, f.PrefillSecondsPerToken)
	if f.Prefill.Source == "scraped" && len(prefillCosts) == 0 {
		return f, fmt.Sprintf("stale or missing metrics: no engine measured a prefill cost in the last %v (%d older samples ignored), and too few prefills were measured (%d, need %d)",
			pl.cfg.MaxAge, f.StaleSamples, f.Prefill.Samples, minPrefillSamples)
	}
	if len(ks) == 0 {
		return f, fmt.Sprintf("stale or missing metrics: no busy decode engine measured its inter-token latency in the last %v, and no idle one ever did (%d older samples ignored)", pl.cfg.MaxAge, f.StaleSamples)
	}
	f.DecodePoints, f.MeanBatch = len(ks), Mean(ks)
	f.DecodeFit, f.StepA, f.StepB, f.StepP, f.StepSigma = fitDecodeCurve(ks, tpots)
	f.StepBatchMin, f.StepBatchMax = slices.Min(ks), slices.Max(ks)
	if f.DecodeFit == "fit" {
		f.StepBSE, f.stepPivot = slopeError(ks, f.StepP, f.StepSigma)
	}
	if len(transferCosts) > 0 {
		f.Overhead = median(transferCosts) * f.MeanUncached
	}
	if f.ArrivalDispersion >= burstyDispersion {
		life := time.Duration(max(f.MeanOutput-1, 1) * f.stepSeconds() * float64(time.Second))
		f.BurstRequests = largestBurst(pl.arrivals, now, life)
	}
	return f, ""
}

// median is the middle of xs, the mean of the two middle ones when their
// number is even, 0 when there are none.
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
