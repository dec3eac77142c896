package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// Span is one phase of the time to first token over a level's requests,
// in milliseconds.
type Span struct {
	Name string  `json:"name"`
	Mean float64 `json:"mean_ms"`
	P90  float64 `json:"p90_ms"`
}

// Breakdown splits the TTFT of one target's requests at one load into the
// phases their answers' Server-Timing headers name — llm-d's "true TTFT"
// spans, per request rather than from histograms: through Tandem's proxy,
// proxy (before the decode leg: parsing, routing, admission) and
// prefill_leg (the prefill engine's queue and prefill and the round trip),
// then the decode engine's api (its HTTP server's own time before the
// engine had the request), queue, kv_pull and prefill; on a colocated
// engine, its api, queue and prefill. Rest is the TTFT the entries do not
// cover: the network and the processes' wake-ups, and the first chunk's
// way out.
type Breakdown struct {
	// N is the completed requests whose answer had a Server-Timing header:
	// every span is over them, a phase a request did not have (kv_pull on
	// the local path) counting 0, so that the means add up to TTFT's.
	N     int    `json:"n"`
	TTFT  Span   `json:"ttft"`
	Spans []Span `json:"spans"`
}

// spanOrder is the order the known phases happen in.
var spanOrder = []string{"proxy", "prefill_leg", "api", "queue", "kv_pull", "prefill"}

// RestSpan names the TTFT no Server-Timing entry covers.
const RestSpan = "rest"

// NewBreakdown is the breakdown of records (failed ones and those without
// Server-Timing are left out), nil when none had a Server-Timing header.
func NewBreakdown(records []Record) *Breakdown {
	var recs []*Record
	names := map[string]bool{}
	for i := range records {
		r := &records[i]
		if r.Err != "" || len(r.Timing) == 0 {
			continue
		}
		recs = append(recs, r)
		for n := range r.Timing {
			names[n] = true
		}
	}
	if len(recs) == 0 {
		return nil
	}
	order := slices.DeleteFunc(slices.Clone(spanOrder), func(n string) bool { return !names[n] })
	for _, n := range slices.Sorted(maps.Keys(names)) {
		if !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	span := func(name string, f func(*Record) float64) Span {
		xs := make([]float64, len(recs))
		for i, r := range recs {
			xs[i] = f(r)
		}
		s := Summarize(xs)
		return Span{Name: name, Mean: s.Mean, P90: s.P90}
	}
	b := &Breakdown{N: len(recs), TTFT: span("ttft", func(r *Record) float64 { return ms(r.TTFT) })}
	for _, n := range order {
		b.Spans = append(b.Spans, span(n, func(r *Record) float64 { return r.Timing[n] }))
	}
	b.Spans = append(b.Spans, span(RestSpan, func(r *Record) float64 {
		rest := ms(r.TTFT)
		for _, d := range r.Timing {
			rest -= d
		}
		return rest
	}))
	return b
}

// Span returns the span called name, and whether there is one.
func (b *Breakdown) Span(name string) (Span, bool) {
	for _, s := range b.Spans {
		if s.Name == name {
			return s, true
		}
	}
	return Span{}, false
}

// WriteBreakdowns writes the TTFT breakdown of every result of s that has
// one, a row per target and load, a column per phase; nothing when no
// answer carried Server-Timing.
func WriteBreakdowns(w io.Writer, s *Suite) error {
	var cols []string
	found := false
	for _, r := range s.Results {
		if r.Breakdown == nil {
			continue
		}
		found = true
		for _, sp := range r.Breakdown.Spans {
			if !slices.Contains(cols, sp.Name) {
				cols = append(cols, sp.Name)
			}
		}
	}
	if !found {
		return nil
	}
	// rest last, the known phases in their order.
	slices.SortStableFunc(cols, func(a, b string) int { return rank(a) - rank(b) })
	fmt.Fprintln(w, "TTFT breakdown per request from the answers' Server-Timing headers (ms, mean / p90; a phase a request did not have counts 0, so the means add up to the TTFT mean):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\tload\tn\tTTFT\t%s\t\n", strings.Join(cols, "\t"))
	for _, r := range s.Results {
		b := r.Breakdown
		if b == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f / %.0f\t", r.Target, r.Load, b.N, b.TTFT.Mean, b.TTFT.P90)
		for _, c := range cols {
			if sp, ok := b.Span(c); ok {
				fmt.Fprintf(tw, "%.1f / %.1f\t", sp.Mean, sp.P90)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func rank(name string) int {
	if name == RestSpan {
		return len(spanOrder) + 2
	}
	if i := slices.Index(spanOrder, name); i >= 0 {
		return i
	}
	return len(spanOrder) + 1
}
