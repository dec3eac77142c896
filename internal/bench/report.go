package bench

import (
	"cmp"
	"encoding/json"
	"io"
	"slices"
	"time"
)

// Report summarizes the requests of one target at one load.
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
	// Resent counts the requests sent again on a fresh connection because
	// the server had closed their kept-alive one before answering
	// (Outcome.Resent): its keep-alive policy, not failures. Those that
	// then failed are in Failed too.
	Resent int `json:"resent,omitempty"`
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
func NewReport(model string, load Load, duration time.Duration, outcomes []Outcome) *Report {
	r := &Report{Model: model, Concurrency: load.Concurrency, Rate: load.Rate, Requests: len(outcomes), Duration: duration.Seconds()}
	var ttft, tpot, itl, e2e []float64
	errs := map[string]int{}
	for i := range outcomes {
		o := &outcomes[i]
		if o.Resent {
			r.Resent++
		}
		if o.Err != nil {
			r.Failed++
			errs[o.Err.Error()]++
			continue
		}
		r.Completed++
		r.TotalInputTokens += o.PromptTokens
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

// WriteJSON writes res (a *Suite, say) as indented JSON.
func WriteJSON(w io.Writer, res any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
