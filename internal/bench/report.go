package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// Report is the result of one concurrency level.
type Report struct {
	// Model is the model the requests named.
	Model string `json:"model"`
	// Concurrency is the in-flight limit (0: none, with a rate).
	Concurrency int `json:"concurrency"`
	// Rate is the Poisson arrival rate, 0 for a closed loop.
	Rate      float64 `json:"rate"`
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Failed    int     `json:"failed"`
	// Duration is from the first request to the end of the last, seconds.
	Duration          float64 `json:"duration_s"`
	TotalInputTokens  int     `json:"total_input_tokens"`
	TotalOutputTokens int     `json:"total_output_tokens"`
	// Throughputs count completed requests only, per second of Duration.
	RequestThroughput float64 `json:"request_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
	TotalThroughput   float64 `json:"total_token_throughput"`
	TTFT              Summary `json:"ttft"`
	TPOT              Summary `json:"tpot"`
	ITL               Summary `json:"itl"`
	E2E               Summary `json:"e2e"`
	// Errors counts the distinct failure messages, most frequent first.
	Errors []ErrorCount `json:"errors,omitempty"`
}

// ErrorCount is a failure message and how many requests failed with it.
type ErrorCount struct {
	Error string `json:"error"`
	Count int    `json:"count"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// NewReport summarizes the outcomes of one level that took duration.
// Latencies are summarized over completed requests only; TPOT over those
// with at least two output tokens.
func NewReport(concurrency int, cfg Config, duration time.Duration, outcomes []Outcome) *Report {
	r := &Report{Model: cfg.Model, Concurrency: concurrency, Rate: cfg.Rate, Requests: len(outcomes), Duration: duration.Seconds()}
	var ttft, tpot, itl, e2e []float64
	errs := map[string]int{}
	for i := range outcomes {
		o := &outcomes[i]
		if o.Err != nil {
			r.Failed++
			errs[o.Err.Error()]++
			continue
		}
		r.Completed++
		in := o.PromptTokens
		if in == 0 {
			in = cfg.PromptTokens
		}
		r.TotalInputTokens += in
		r.TotalOutputTokens += o.OutputTokens
		ttft = append(ttft, ms(o.TTFT))
		e2e = append(e2e, ms(o.E2E))
		if o.OutputTokens > 1 {
			tpot = append(tpot, ms(o.TPOT()))
		}
		for _, d := range o.ITL {
			itl = append(itl, ms(d))
		}
	}
	if s := duration.Seconds(); s > 0 {
		r.RequestThroughput = float64(r.Completed) / s
		r.OutputThroughput = float64(r.TotalOutputTokens) / s
		r.TotalThroughput = float64(r.TotalInputTokens+r.TotalOutputTokens) / s
	}
	r.TTFT, r.TPOT, r.ITL, r.E2E = Summarize(ttft), Summarize(tpot), Summarize(itl), Summarize(e2e)
	for e, n := range errs {
		r.Errors = append(r.Errors, ErrorCount{e, n})
	}
	slices.SortFunc(r.Errors, func(a, b ErrorCount) int {
		return cmp.Or(b.Count-a.Count, cmp.Compare(a.Error, b.Error))
	})
	return r
}

// mode describes how requests arrived.
func (r *Report) mode() string {
	switch {
	case r.Rate == 0:
		return fmt.Sprintf("concurrency %d, closed loop", r.Concurrency)
	case r.Concurrency == 0:
		return fmt.Sprintf("Poisson arrivals at %g req/s, no concurrency cap", r.Rate)
	}
	return fmt.Sprintf("Poisson arrivals at %g req/s, at most %d in flight", r.Rate, r.Concurrency)
}

// WriteText writes r as a human-readable block.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "== %s ==\n", r.mode())
	fmt.Fprintf(tw, "completed %d of %d, failed %d, in %.2fs\n", r.Completed, r.Requests, r.Failed, r.Duration)
	fmt.Fprintf(tw, "throughput: %.2f req/s, %.1f output tok/s, %.1f total tok/s (%d in, %d out)\n",
		r.RequestThroughput, r.OutputThroughput, r.TotalThroughput, r.TotalInputTokens, r.TotalOutputTokens)
	fmt.Fprintf(tw, "latency (ms)\tmean\tp50\tp90\tp99\tmax\t\n")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"TTFT", r.TTFT}, {"TPOT", r.TPOT}, {"ITL", r.ITL}, {"E2E", r.E2E}} {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", row.name, row.s.Mean, row.s.P50, row.s.P90, row.s.P99, row.s.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, e := range r.Errors {
		if i == 5 {
			fmt.Fprintf(w, "  ... and %d more distinct errors\n", len(r.Errors)-i)
			break
		}
		fmt.Fprintf(w, "  failed %d×: %s\n", e.Count, e.Error)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// WriteSweep writes one line per level, for comparing levels at a glance.
func WriteSweep(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "conc\tok\tfail\treq/s\tout tok/s\tTTFT p50\tTTFT p99\tTPOT p50\tTPOT p99\tITL p99\tE2E p99\t\n")
	for _, r := range reports {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.1f\t\n",
			r.Concurrency, r.Completed, r.Failed, r.RequestThroughput, r.OutputThroughput,
			r.TTFT.P50, r.TTFT.P99, r.TPOT.P50, r.TPOT.P99, r.ITL.P99, r.E2E.P99)
	}
	fmt.Fprintln(tw, "(latencies in ms)")
	return tw.Flush()
}

// SweepResult is the JSON document of a RunAll sweep.
type SweepResult struct {
	Config  Config    `json:"config"`
	Started time.Time `json:"started"`
	Results []*Report `json:"results"`
}

// WriteJSON writes res (a *Suite or *SweepResult) as indented JSON.
func WriteJSON(w io.Writer, res any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
