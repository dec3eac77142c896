package experiment

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// PlanStep is one decision of the adaptive configuration's planner, as its
// proxy's GET /tandem/plan answered it.
type PlanStep struct {
	// T is the decision's time in seconds from the start of the measured
	// requests (negative during the warm-up).
	T float64 `json:"t_s"`
	// Prefill and Decode are the split it runs; BestP and BestD the split
	// its model predicts the most goodput for, BestGoodput that goodput
	// (requests/s).
	Prefill     int     `json:"prefill"`
	Decode      int     `json:"decode"`
	BestP       int     `json:"best_p"`
	BestD       int     `json:"best_d"`
	BestGoodput float64 `json:"best_goodput_rps"`
	// Threshold is the conditional decider's threshold it chose.
	Threshold int `json:"threshold_tokens"`
	// Changed says the split moved at this decision; Held why it did not
	// move to the best one.
	Changed bool   `json:"changed,omitempty"`
	Held    string `json:"held,omitempty"`
	// Requests and Arrival are the requests in its window and their rate.
	Requests int     `json:"window_requests"`
	Arrival  float64 `json:"window_arrival_rps"`
}

// planAnswer is the part of GET /tandem/plan a PlanStep is read from.
type planAnswer struct {
	Decision *planDecision `json:"decision"`
}

// planDecision is the part of the planner's decision a PlanStep keeps.
type planDecision struct {
	At      time.Time `json:"at"`
	Prefill int       `json:"prefill"`
	Decode  int       `json:"decode"`
	Best    struct {
		P       int     `json:"p"`
		D       int     `json:"d"`
		Goodput float64 `json:"goodput_rps"`
	} `json:"best"`
	Threshold int    `json:"threshold_tokens"`
	Changed   bool   `json:"changed"`
	Held      string `json:"held"`
	Fit       struct {
		Requests int     `json:"requests"`
		Arrival  float64 `json:"arrival_rps"`
	} `json:"fit"`
}

// planWatch polls a proxy's GET /tandem/plan and keeps every distinct
// decision, so the report can say what the planner did while the
// requests ran, not only where it ended.
type planWatch struct {
	url    string
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	zero   time.Time // the start of the measured requests
	last   time.Time // the last decision's time
	steps  []PlanStep
	errors int
}

// watchPlan starts polling the proxy at url every period; Stop ends it.
func watchPlan(ctx context.Context, url string, period time.Duration) *planWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &planWatch{url: url, cancel: cancel, done: make(chan struct{}), zero: time.Now()}
	go func() {
		defer close(w.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			w.poll(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// markStart makes now the time origin of the steps (the measured
// requests' start); earlier steps get negative times.
func (w *planWatch) markStart() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	shift := now.Sub(w.zero).Seconds()
	for i := range w.steps {
		w.steps[i].T -= shift
	}
	w.zero = now
}

// Stop polls once more, ends the polling and returns the decisions seen.
func (w *planWatch) Stop(ctx context.Context) []PlanStep {
	w.cancel()
	<-w.done
	w.poll(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.steps)
}

// poll reads the proxy's last decision and keeps it when it is new.
func (w *planWatch) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url+"/tandem/plan", nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.mu.Lock()
		w.errors++
		w.mu.Unlock()
		return
	}
	defer resp.Body.Close()
	var a planAnswer
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&a) != nil || a.Decision == nil {
		return
	}
	w.note(a)
}

// note keeps a's decision when it is newer than the last one kept.
func (w *planWatch) note(a planAnswer) {
	d := a.Decision
	w.mu.Lock()
	defer w.mu.Unlock()
	if !d.At.After(w.last) {
		return
	}
	w.last = d.At
	w.steps = append(w.steps, PlanStep{T: d.At.Sub(w.zero).Seconds(), Prefill: d.Prefill, Decode: d.Decode,
		BestP: d.Best.P, BestD: d.Best.D, BestGoodput: d.Best.Goodput, Threshold: d.Threshold, Changed: d.Changed,
		Held: d.Held, Requests: d.Fit.Requests, Arrival: d.Fit.Arrival})
}

// heldReason is the kind of a Held text: its words before the first
// colon ("dwell", "hysteresis", or the whole of a short text).
func heldReason(held string) string {
	kind, _, _ := strings.Cut(held, ":")
	if len(kind) > 48 {
		kind = kind[:48] + "…"
	}
	return kind
}

// writePlanSteps prints a summary of the planner's decisions: how many,
// each change of the split or of the threshold with its time, and the
// reasons it held, counted.
func writePlanSteps(w io.Writer, steps []PlanStep) {
	if len(steps) == 0 {
		fmt.Fprintln(w, "    planner: no decision read from GET /tandem/plan")
		return
	}
	var moves []string
	held := map[string]int{}
	prev := steps[0]
	moves = append(moves, fmt.Sprintf("%+.0fs %dP:%dD thr %d", prev.T, prev.Prefill, prev.Decode, prev.Threshold))
	for _, s := range steps {
		if s.Held != "" {
			held[heldReason(s.Held)]++
		}
		if s.Prefill != prev.Prefill || s.Decode != prev.Decode || s.Threshold != prev.Threshold {
			moves = append(moves, fmt.Sprintf("%+.0fs %dP:%dD thr %d (best %dP:%dD %.3g req/s)", s.T, s.Prefill, s.Decode, s.Threshold, s.BestP, s.BestD, s.BestGoodput))
		}
		prev = s
	}
	var reasons []string
	for _, k := range slices.Sorted(maps.Keys(held)) {
		reasons = append(reasons, fmt.Sprintf("%d× %s", held[k], k))
	}
	last := steps[len(steps)-1]
	fmt.Fprintf(w, "    planner: %d decisions (times from the first measured request); split and threshold: %s\n", len(steps), strings.Join(moves, " → "))
	fmt.Fprintf(w, "    last: %dP:%dD, best %dP:%dD predicted %.3g req/s, window %d requests at %.3g req/s; held: %s\n",
		last.Prefill, last.Decode, last.BestP, last.BestD, last.BestGoodput, last.Requests, last.Arrival, cmp.Or(strings.Join(reasons, ", "), "never"))
}
