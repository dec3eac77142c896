package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
)

// PDModel is a DistServe-style placement model, simplified, fitted to one
// disaggregated configuration's requests of one workload: how many
// requests/s one prefill engine and one decode engine sustain while the
// goal fraction of requests meets the TTFT and TPOT SLOs, and the P:D split
// of N engines that maximises goodput. It is a capacity model, so it is fed
// the engines' service times rather than the rates the run happened to
// offer (which only bound the capacity from below):
//
// Prefill. Service time s(L) = A + B·L for a prompt of L tokens, fitted to
// the prefill legs (Server-Timing prefill_leg: the prefill engine's work
// and the round trip) of requests whose leg ran alone — no other request's
// leg overlapped it, so the prefill engine was otherwise idle and the leg
// held no queueing. s̄ = s(mean prompt), and the prompt lengths' spread
// gives the service's squared coefficient of variation C² = B²·Var(L)/s̄².
// The rest of a quiet request's TTFT (TTFT − prefill leg: the proxy, the
// decode's KV pull and first step, the network) is an overhead o, the
// median over those requests. A prefill engine is an M/G/1 queue at
// utilisation ρ: its wait W has mean ρ·c·s̄/(1−ρ) with c = (1+C²)/2
// (Pollaczek–Khinchine) and, approximately, the tail P(W > t) ≈
// ρ·exp(−t·(1−ρ)/(c·s̄)). Under FCFS a request's wait does not depend on
// its own service, so a request with prompt L meets the TTFT SLO with
// probability P(W ≤ SLO − s(L) − o) — zero when its own prefill and the
// overhead already exceed the SLO. With q = √goal (each SLO is given its
// share of the goal, as if TTFT and TPOT misses were independent), the
// engine may run at the ρ* where the mean of that probability over the
// workload's prompts is q, and serves ρ*/s̄ requests/s. A workload with
// more than 1 − q of its prompts too long for the SLO on one prefill
// engine (PrefillTooLong) has no ρ*: one engine per prompt cannot meet it,
// whatever the P:D ratio. With P prefill engines behind tandem proxy's
// round-robin dispatch each engine sees every P-th arrival — gaps with
// squared coefficient of variation 1/P rather than Poisson's 1 — and
// queues less at the same utilisation: the wait's tail uses c =
// (1/P + C²)/2 (Kingman's GI/G/1 approximation), so the rate per prefill
// engine grows with P (PrefillRateAt); a split of N engines is scored
// with its own P. (Checked on simulated engines at N = 8–32 before this
// correction: the Poisson rate was 2.4–3.3× below what each engine
// sustained; docs/performance-log.md.)
//
// Decode. The decode engine's step time grows with its batch: for every
// request, its TPOT and the mean number of requests decoding beside it
// (itself included, time-weighted over its decode, from every request's
// [start+TTFT, start+E2E] in the same level) give a point (k, TPOT), and
// TPOT = A + B·k is fitted by least squares, with residual deviation σ. The
// batch the engine may carry is k* = (TPOT SLO − A − z·σ)/B (z the normal
// q-quantile, so q of the TPOTs stay under the SLO), at most MaxNumSeqs,
// and a decode engine serves k*/((mean output − 1)·(A + B·k*)) requests/s
// (Little's law: each request decodes mean output − 1 tokens after the
// first). Without a usable fit (fewer than 3 points, one batch size, or a
// TPOT that did not grow) the decode rate is the highest request
// throughput of a level whose TPOT met the SLO for q of its requests: a
// lower bound.
//
// Split. N engines as P prefill and D decode engines serve min(P·prefill
// rate at P, D·decode rate); BestSplits gives the best P for a few N.
type PDModel struct {
	Workload   string  `json:"workload"`
	Target     string  `json:"target"`
	Goal       float64 `json:"goal"`
	MeanPrompt float64 `json:"mean_prompt_tokens"`
	MeanOutput float64 `json:"mean_output_tokens"`

	// PrefillSource says where the service time came from: "alone" (the
	// prefill legs that ran alone, PrefillSamples of them) or, without
	// Server-Timing or without such legs, "lowest TTFT p50" (the lowest
	// level's TTFT median, queueing and overhead included).
	PrefillSource  string  `json:"prefill_source"`
	PrefillSamples int     `json:"prefill_samples"`
	PrefillA       float64 `json:"prefill_ms_at_0"`
	PrefillB       float64 `json:"prefill_ms_per_token"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	PrefillCV2     float64 `json:"prefill_cv2"`
	Overhead       float64 `json:"overhead_seconds"`
	PrefillBusy    float64 `json:"prefill_utilisation"`
	// PrefillRates is PrefillRateAt(P) for P = 1, 2, 4, 8, 16, 32: what
	// one of P prefill engines serves behind round-robin dispatch.
	PrefillRates map[int]float64 `json:"prefill_rate_per_engine_at_p,omitempty"`
	// PrefillTooLong is the fraction of the prompts whose own prefill and
	// the overhead exceed the TTFT SLO (they miss it even on an idle
	// engine).
	PrefillTooLong float64 `json:"prefill_too_long,omitempty"`
	PrefillRate    float64 `json:"prefill_rate"`

	// DecodeFit is "fit", "lower bound" or "none" (nothing decoded).
	DecodeFit     string  `json:"decode_fit"`
	DecodeSamples int     `json:"decode_samples"`
	StepA         float64 `json:"tpot_ms_at_batch_0,omitempty"`
	StepB         float64 `json:"tpot_ms_per_sequence,omitempty"`
	StepSigma     float64 `json:"tpot_residual_ms,omitempty"`
	ObservedBatch float64 `json:"observed_batch_max"`
	DecodeBatch   float64 `json:"decode_batch_at_slo"`
	DecodeTPOT    float64 `json:"decode_tpot_ms_at_batch,omitempty"`
	// Extrapolated says that DecodeBatch is well beyond the batches seen
	// (more than 1.25 times ObservedBatch): the line is trusted further
	// than it was measured.
	Extrapolated bool    `json:"extrapolated,omitempty"`
	DecodeRate   float64 `json:"decode_rate"`

	BestSplits   []Split `json:"best_splits,omitempty"`
	Unattainable string  `json:"unattainable,omitempty"`

	// services are the prompts' prefill service times (seconds), slo the
	// TTFT SLO (seconds) and q the TTFT share of the goal, kept for
	// PrefillRateAt.
	services []float64
	slo, q   float64
}

// Split is N engines as P prefill and D decode engines and the goodput the
// model predicts for them.
type Split struct {
	N       int     `json:"n"`
	P       int     `json:"p"`
	D       int     `json:"d"`
	Goodput float64 `json:"goodput_rps"`
}

// SplitSizes are the engine counts BestSplits is computed for.
var SplitSizes = []int{2, 4, 8, 16, 32}

// ModelPD fits a PDModel to target's results in s (whose plan has the SLO
// and goal); maxSeqs is the decode engine's --max-num-seqs.
func ModelPD(s *Suite, target string, maxSeqs int) PDModel {
	p := s.Plan
	m := PDModel{Target: target, Goal: cmpOr(p.Goal, DefaultGoal)}
	if p.Workload != nil {
		m.Workload = p.Workload.Name
	}
	q := math.Sqrt(m.Goal)
	var results []*Result
	var prompts []float64
	var outTok float64
	for _, r := range s.Results {
		if r.Target != target {
			continue
		}
		results = append(results, r)
		for _, rec := range r.Records {
			if rec.Err == "" {
				prompts = append(prompts, float64(rec.PromptTokens))
				outTok += float64(rec.OutputTokens)
			}
		}
	}
	if len(prompts) == 0 {
		m.Unattainable = "no completed request of " + target + " to model from"
		return m
	}
	m.MeanPrompt, m.MeanOutput = planner.Mean(prompts), outTok/float64(len(prompts))

	m.fitPrefill(results, prompts, p.SLO.TTFT, q)
	m.fitDecode(results, p.SLO.TPOT, q, maxSeqs)
	switch {
	case m.Unattainable != "":
	case m.PrefillRate <= 0 && m.PrefillTooLong > 0:
		m.Unattainable = fmt.Sprintf("%.0f%% of the prompts take longer than the TTFT SLO to prefill alone (with the overhead), more than the %.0f%% the goal allows to miss", 100*m.PrefillTooLong, 100*(1-q))
	case m.PrefillRate <= 0:
		m.Unattainable = "the prefill engine misses the TTFT SLO at any load"
	case m.DecodeFit == "none":
		m.Unattainable = "no decode to measure (outputs of one token)"
	case m.DecodeRate <= 0:
		m.Unattainable = "the decode engine misses the TPOT SLO at every batch"
	}
	if m.Unattainable == "" {
		m.PrefillRates = map[int]float64{}
		for _, p := range []int{1, 2, 4, 8, 16, 32} {
			m.PrefillRates[p] = m.PrefillRateAt(p)
		}
		for _, n := range SplitSizes {
			m.BestSplits = append(m.BestSplits, m.BestSplit(n))
		}
	}
	return m
}

// BestSplit is the P:D split of n engines that maximises min(P·prefill
// rate at P, D·decode rate), the smallest P on a tie.
func (m *PDModel) BestSplit(n int) Split {
	best := Split{N: n, P: 1, D: n - 1}
	for p := 1; p < n; p++ {
		if g := m.SplitGoodput(p, n-p); g > best.Goodput {
			best = Split{N: n, P: p, D: n - p, Goodput: g}
		}
	}
	return best
}

// levels are the records of each result and round: each run of the
// workload against the target.
func levels(results []*Result) [][]*Record {
	var out [][]*Record
	for _, r := range results {
		byRound := map[int][]*Record{}
		var rounds []int
		for i := range r.Records {
			rec := &r.Records[i]
			if _, ok := byRound[rec.Round]; !ok {
				rounds = append(rounds, rec.Round)
			}
			byRound[rec.Round] = append(byRound[rec.Round], rec)
		}
		slices.Sort(rounds)
		for _, k := range rounds {
			out = append(out, byRound[k])
		}
	}
	return out
}

func (m *PDModel) fitPrefill(results []*Result, prompts []float64, slo time.Duration, q float64) {
	// The legs that ran alone: [start + proxy, + prefill_leg] overlapping
	// no other leg of the level.
	type leg struct {
		from, to float64 // ms from the level's start
		rec      *Record
	}
	var xs, ys, rest []float64
	for _, lv := range levels(results) {
		var legs []leg
		for _, rec := range lv {
			if d := rec.Timing["prefill_leg"]; rec.Err == "" && d > 0 {
				from := ms(rec.Start) + rec.Timing["proxy"]
				legs = append(legs, leg{from, from + d, rec})
			}
		}
		for i, a := range legs {
			alone := true
			for j, b := range legs {
				if i != j && a.from < b.to && b.from < a.to {
					alone = false
					break
				}
			}
			if alone {
				xs = append(xs, float64(a.rec.PromptTokens))
				ys = append(ys, a.to-a.from)
				rest = append(rest, ms(a.rec.TTFT)-(a.to-a.from))
			}
		}
	}
	m.PrefillSamples = len(xs)
	if len(xs) > 0 {
		m.PrefillSource = "alone"
		a, b, _, ok := fitLine(xs, ys)
		if !ok || b <= 0 || a < 0 {
			a, b = 0, planner.Sum(ys)/planner.Sum(xs) // one length, or noise: proportional to the prompt
		}
		m.PrefillA, m.PrefillB = a, b
		slices.Sort(rest)
		m.Overhead = max(Percentile(rest, 50), 0) / 1000
	} else {
		// No Server-Timing (not Tandem's proxy) or every leg queued: the
		// quietest level's TTFT median, queueing and overhead included.
		m.PrefillSource = "lowest TTFT p50"
		low := math.Inf(1)
		for _, r := range results {
			if r.Report != nil && r.Completed > 0 {
				low = min(low, r.TTFT.P50)
			}
		}
		m.PrefillB = low / m.MeanPrompt
	}
	s := (m.PrefillA + m.PrefillB*m.MeanPrompt) / 1000
	m.PrefillSeconds = s
	if s <= 0 || math.IsInf(s, 0) || math.IsNaN(s) {
		m.PrefillSeconds, m.PrefillRate = 0, 0
		return
	}
	sd := m.PrefillB * planner.StdDev(prompts) / 1000
	m.PrefillCV2 = sd * sd / (s * s)
	m.services = make([]float64, len(prompts))
	for i, l := range prompts {
		m.services[i] = (m.PrefillA + m.PrefillB*l) / 1000
	}
	m.slo, m.q = slo.Seconds(), q
	m.PrefillBusy, m.PrefillTooLong = m.prefillBusyAt(1)
	m.PrefillRate = m.PrefillBusy / s
}

// prefillBusyAt is ρ* of one of p prefill engines behind round-robin
// dispatch (tandem proxy's default for the prefill pool): each sees every
// p-th arrival of a Poisson stream, gaps with squared coefficient of
// variation 1/p (Erlang-p), and regular arrivals queue less at the same
// utilisation.
func (m *PDModel) prefillBusyAt(p int) (rho, tooLong float64) {
	if m.slo <= 0 {
		return 1, 0
	}
	return prefillBusy(m.services, m.PrefillSeconds, 1/float64(max(p, 1)), m.PrefillCV2, m.Overhead, m.slo, m.q)
}

// PrefillRateAt is the requests/s one of p prefill engines behind
// round-robin dispatch serves within the TTFT SLO's share of the goal
// (PrefillRate is p = 1). It is 0 for a model with no prefill fit.
func (m *PDModel) PrefillRateAt(p int) float64 {
	if p <= 1 || m.PrefillSeconds <= 0 || m.services == nil {
		return m.PrefillRate
	}
	rho, _ := m.prefillBusyAt(p)
	return rho / m.PrefillSeconds
}

// prefillBusy is the prefill half of the model, shared with the online
// planner (planner.PrefillBusy).
func prefillBusy(services []float64, s, ca2, cv2, overhead, slo, q float64) (rho, tooLong float64) {
	return planner.PrefillBusy(services, s, ca2, cv2, overhead, slo, q)
}

func (m *PDModel) fitDecode(results []*Result, slo time.Duration, q float64, maxSeqs int) {
	var ks, ts []float64
	for _, lv := range levels(results) {
		type span struct{ from, to float64 }
		var spans []span
		var recs []*Record
		for _, rec := range lv {
			if rec.Err == "" && rec.OutputTokens > 1 && rec.E2E > rec.TTFT {
				spans = append(spans, span{ms(rec.Start + rec.TTFT), ms(rec.Start + rec.E2E)})
				recs = append(recs, rec)
			}
		}
		for i, a := range spans {
			var overlap float64
			for _, b := range spans {
				overlap += max(0, min(a.to, b.to)-max(a.from, b.from))
			}
			ks = append(ks, overlap/(a.to-a.from))
			ts = append(ts, ms(recs[i].tpot()))
		}
	}
	m.DecodeSamples = len(ks)
	if len(ks) == 0 {
		m.DecodeFit = "none"
		return
	}
	m.ObservedBatch = slices.Max(ks)
	sloMS := float64(slo) / float64(time.Millisecond)
	a, b, sigma, ok := fitLine(ks, ts)
	if ok && len(ks) >= 3 && b > 0 {
		m.DecodeFit, m.StepA, m.StepB, m.StepSigma = "fit", a, b, sigma
		k := planner.DecodeBatchAtSLO(a, b, sigma, sloMS, q, maxSeqs)
		if k <= 0 {
			return // DecodeRate 0: unattainable
		}
		m.DecodeBatch, m.DecodeTPOT = k, a+b*k
		m.Extrapolated = k > 1.25*m.ObservedBatch
		m.DecodeRate = planner.DecodeRate(k, m.DecodeTPOT/1000, m.MeanOutput)
		return
	}
	// A lower bound: the best throughput of a level that met the TPOT SLO.
	m.DecodeFit = "lower bound"
	for _, r := range results {
		if r.Report == nil || r.Completed == 0 {
			continue
		}
		met := 0
		for _, rec := range r.Records {
			if rec.Err == "" && (slo <= 0 || rec.tpot() <= slo) {
				met++
			}
		}
		if float64(met) >= q*float64(len(r.Records)) && r.RequestThroughput > m.DecodeRate {
			m.DecodeRate = r.RequestThroughput
			m.DecodeBatch = m.ObservedBatch
		}
	}
}

// fitLine is planner.FitLine: the least-squares line y = a + b·x and its
// residual standard deviation; ok when the xs differ.
func fitLine(xs, ys []float64) (a, b, sigma float64, ok bool) { return planner.FitLine(xs, ys) }

// WritePDModelHeader writes the model's formulas, as PDModel's doc says
// them, for a report.
func WritePDModelHeader(w io.Writer) {
	fmt.Fprint(w, `P:D ratio model (DistServe-style placement, simplified; fitted to the disaggregated configuration's own requests):
  q = sqrt(goal): each SLO gets its share of the goal (TTFT and TPOT misses taken as independent)
  prefill: service s(L) = A + B·L fitted to the prefill legs (Server-Timing prefill_leg) that ran alone (no other leg overlapping:
    no queueing); s̄ = s(mean prompt), C² = B²·Var(L)/s̄², overhead o = median(TTFT − prefill leg) of those requests;
    M/G/1 wait tail P(W > t) ≈ ρ·exp(−t(1−ρ)/(c·s̄)), c = (1+C²)/2; a prompt of L tokens meets the TTFT SLO when
    W ≤ t(L) = TTFT SLO − s(L) − o (never when t(L) < 0); ρ* makes the mean of P(W ≤ t(L)) over the prompts q;
    one prefill engine serves ρ*/s̄ req/s; one of P behind round-robin dispatch sees arrival gaps with SCV 1/P, so its
    wait tail uses c = (1/P + C²)/2 (Kingman) and it serves more
  decode: per request, k = the mean number of requests decoding beside it (itself included, time-weighted) and its TPOT;
    fit TPOT = A + B·k (residual σ); k* = min((TPOT SLO − A − z·σ)/B, max-num-seqs), z = normal quantile of q;
    one decode engine serves k*/((mean output − 1)·(A + B·k*)) req/s (Little's law)
  N engines: the P:D split maximising min(P·prefill rate at P, D·decode rate)
`)
}

// Write writes the model of one workload for a report.
func (m *PDModel) Write(w io.Writer, slo SLO) {
	fmt.Fprintf(w, "  %s (%s): mean prompt %.0f, output %.0f tokens; goal %.0f%% → q = %.3f\n", m.Workload, m.Target, m.MeanPrompt, m.MeanOutput, 100*m.Goal, math.Sqrt(m.Goal))
	switch m.PrefillSource {
	case "alone":
		fmt.Fprintf(w, "    prefill engine: %d legs ran alone: s(L) = %.1f + %.3f·L ms → s̄ = %.3f s (%.0f prompt tok/s), C² = %.3f, o = %.3f s;",
			m.PrefillSamples, m.PrefillA, m.PrefillB, m.PrefillSeconds, m.MeanPrompt/max(m.PrefillSeconds, 1e-9), m.PrefillCV2, m.Overhead)
	case "lowest TTFT p50":
		fmt.Fprintf(w, "    prefill engine: no prefill leg ran alone (or no Server-Timing): s̄ = the lowest TTFT p50, %.3f s (queueing and overhead included, so the rate is a lower bound);", m.PrefillSeconds)
	}
	if m.PrefillSource != "" {
		fmt.Fprintf(w, " TTFT SLO %v", slo.TTFT)
		if m.PrefillTooLong > 0 {
			fmt.Fprintf(w, " (%.0f%% of the prompts miss it alone)", 100*m.PrefillTooLong)
		}
		fmt.Fprintf(w, " → ρ* = %.2f → %.3f req/s", m.PrefillBusy, m.PrefillRate)
		if len(m.PrefillRates) > 0 {
			fmt.Fprint(w, "; per engine of P behind round-robin:")
			for _, p := range []int{2, 4, 8, 16, 32} {
				if r, ok := m.PrefillRates[p]; ok {
					fmt.Fprintf(w, " P=%d %.3f", p, r)
				}
			}
		}
		fmt.Fprintln(w)
	}
	switch m.DecodeFit {
	case "fit":
		fmt.Fprintf(w, "    decode engine: %d requests, batches up to %.1f: TPOT = %.1f + %.2f·k ms (σ %.1f) → k* = %.1f at TPOT %v (mean TPOT %.1f ms) → %.3f req/s (%.0f output tok/s)",
			m.DecodeSamples, m.ObservedBatch, m.StepA, m.StepB, m.StepSigma, m.DecodeBatch, slo.TPOT, m.DecodeTPOT, m.DecodeRate, m.DecodeRate*m.MeanOutput)
		if m.Extrapolated {
			fmt.Fprintf(w, " — extrapolated beyond the batches measured")
		}
		fmt.Fprintln(w)
	case "lower bound":
		fmt.Fprintf(w, "    decode engine: no usable fit of TPOT against the batch (%d requests, batches up to %.1f): ≥ %.3f req/s measured at a level that met the TPOT SLO (a lower bound)\n",
			m.DecodeSamples, m.ObservedBatch, m.DecodeRate)
	}
	if m.Unattainable != "" {
		fmt.Fprintf(w, "    %s: no P:D ratio meets the SLO\n", m.Unattainable)
		return
	}
	fmt.Fprintf(w, "    best split of N engines (predicted goodput):")
	for _, s := range m.BestSplits {
		fmt.Fprintf(w, " N=%d %dP:%dD %.2f req/s;", s.N, s.P, s.D, s.Goodput)
	}
	fmt.Fprintln(w)
}
