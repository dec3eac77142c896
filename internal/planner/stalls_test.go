package planner

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestNoLocalPrefillPastTheShortAnswersSlack is run 2 of the P/D
// experiment's long workload in small: the mean answer is long, so the
// mean stream has the slack to wait through a long prompt's prefill, but
// half the answers are short, and a 1,500-token prefill beside them breaks
// their TPOT. The prompts stay remote, though the one prefill engine
// (MinDecode keeps three decodes) cannot keep up with them: the decodes'
// running streams bound the local prompt length, not their mean.
func TestNoLocalPrefillPastTheShortAnswersSlack(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: time.Second, TPOT: 30 * time.Millisecond, Engines: 4, Prefill: 1, MinPrefill: 1, MinDecode: 3, Hysteresis: 1e-9})
	end := t0.Add(20 * time.Second)
	i := 0
	for at := t0; at.Before(end); at = at.Add(250 * time.Millisecond) {
		out := 4 // 60 ms of slack at 10-ms steps
		if i%2 == 1 {
			out = 400
		}
		i++
		pl.ObserveRequest(Request{At: at, PromptTokens: 1500, UncachedTokens: 1500, OutputTokens: out})
	}
	for at := t0; at.Before(end); at = at.Add(time.Second) {
		pl.ObserveEngine(EngineSample{At: at, URL: "p", PrefillSecondsPerToken: prefillCost})
		for i, k := range []float64{1, 2, 3} {
			pl.ObserveEngine(EngineSample{At: at, URL: fmt.Sprint("d", i), Decode: true, PrefillSecondsPerToken: prefillCost, Running: k, ITLSeconds: (9 + 0.5*k) / 1000})
		}
	}
	d := pl.Decide(end)
	if d.Threshold > 1500 || d.Fit.RemoteFraction != 1 {
		t.Fatalf("threshold %d, remote fraction %.2f: the 1500-token prompts (300 ms of prefill) would be prefilled beside 4-token answers with 60 ms of slack", d.Threshold, d.Fit.RemoteFraction)
	}
}

// TestStallsCountTheStreamsALocalPrefillBreaks checks the stall model's
// two sides on one engine: 300-ms local prefills, 40% of its time, beside
// 4-token answers with 60 ms of slack each.
func TestStallsCountTheStreamsALocalPrefillBreaks(t *testing.T) {
	reqs := []Request{{OutputTokens: 4}, {OutputTokens: 4}}
	rate, step, slo := 4/3.0, 0.010, 0.030
	st := newStalls([]float64{0.3, 0.3}, reqs, 1)
	// A stream finds a prefill under way with more than 60 ms left
	// 4/3·(0.3 − 0.06) = 32% of the time, and one arrives in its 3 steps
	// (50 ms stretched) 6.4% of the time; one stall of the mean size fills
	// its slack, and it meets at least one with the probability of a
	// Poisson count of mean 0.4 + 0.067 (the work found, the arrivals).
	single := 1 - (1-rate*0.24)*math.Exp(-rate*3*step/0.6)
	want := max(single, 1-math.Exp(-(0.4+rate*3*step/0.6)))
	if got := st.missed(rate, 0.4, step, slo, math.Inf(1)); math.Abs(got-want) > 1e-9 {
		t.Errorf("missed %.4f, want %.4f", got, want)
	}
	// In chunks of 19 ms (95 tokens) a stream waits at most 19 ms a
	// step: 57 ms over its 3 steps, within its slack.
	if got := newStalls([]float64{0.3, 0.3}, reqs, 0.019).missed(rate, 0.4, step, slo, math.Inf(1)); got != 0 {
		t.Errorf("chunked: missed %.4f, want 0", got)
	}
	// Half the streams long: the longest prefill that leaves no more than
	// 5% of them broken is the short ones' slack.
	reqs = append(reqs, Request{OutputTokens: 400}, Request{OutputTokens: 400})
	if got := newStalls(nil, reqs, 1).longest(step, slo, 0.05); math.Abs(got-0.06) > 1e-9 {
		t.Errorf("longest %.4f s, want the 4-token answers' 0.06 s of slack", got)
	}
	if got := newStalls(nil, reqs, 0.019).longest(step, slo, 0.05); !math.IsInf(got, 1) {
		t.Errorf("chunked: longest %.4f s, want no bound", got)
	}
}

// TestDecodesChunkFromTheirScrapes: decode engines that say they prefill
// in chunks of 64 tokens (13 ms at 0.2 ms a token, within the short
// answers' 20 ms of slack a step) may take the 1,500-token prompts the
// test above keeps remote: the chunk the model uses is theirs, not
// Config's.
func TestDecodesChunkFromTheirScrapes(t *testing.T) {
	pl := newPlanner(t, Config{TTFT: time.Second, TPOT: 30 * time.Millisecond, Engines: 4, Prefill: 1, MinPrefill: 1, MinDecode: 3, Hysteresis: 1e-9})
	end := t0.Add(20 * time.Second)
	i := 0
	for at := t0; at.Before(end); at = at.Add(250 * time.Millisecond) {
		out := 4
		if i%2 == 1 {
			out = 400
		}
		i++
		pl.ObserveRequest(Request{At: at, PromptTokens: 1500, UncachedTokens: 1500, OutputTokens: out})
	}
	for at := t0; at.Before(end); at = at.Add(time.Second) {
		pl.ObserveEngine(EngineSample{At: at, URL: "p", PrefillSecondsPerToken: prefillCost})
		for i, k := range []float64{1, 2, 3} {
			pl.ObserveEngine(EngineSample{At: at, URL: fmt.Sprint("d", i), Decode: true, PrefillSecondsPerToken: prefillCost, Running: k, ITLSeconds: (9 + 0.5*k) / 1000, MaxBatchedTokens: 64})
		}
	}
	d := pl.Decide(end)
	if d.Fit.MaxBatchedTokens != 64 || d.Threshold <= 1500 {
		t.Fatalf("chunk %d tokens, threshold %d (remote fraction %.2f): want the decodes' 64 and the prompts local", d.Fit.MaxBatchedTokens, d.Threshold, d.Fit.RemoteFraction)
	}
}
