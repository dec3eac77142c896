package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// observations returns how many samples a histogram holds.
func observations(t *testing.T, h prometheus.Observer) uint64 {
	t.Helper()
	var d dto.Metric
	if err := h.(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// tickClock moves a millisecond forward at every reading, so that every
// span between two readings is positive.
type tickClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

// TestFetchStages: a request whose KV loads from elsewhere shows in the
// fetch-stage gauge while it loads and not after, each stage's time is
// observed once when it first runs, and its first token's Timing has the
// stages.
func TestFetchStages(t *testing.T) {
	e, m := newEngine(t, Config{Connector: remoteConnector{}, KVWorker: &recordingWorker{}, Clock: &tickClock{t: time.Unix(1e9, 0)}})
	_, _, g := load(t)
	h, err := e.Submit(t.Context(), &Request{Prompt: g.GreedyIDs[:40], Params: greedy(3), KVTransfer: &kvparams.Params{DoRemotePrefill: true}})
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(stage string) float64 { return value(t, m.KVFetchByStage.WithLabelValues(stage)) }
	testutil.WaitFor(t, "the load in progress", 10*time.Second, func() bool { return gauge("in_progress") == 1 })
	if gauge("waiting_to_start") != 0 || gauge("completed_waiting") != 0 {
		t.Errorf("gauge waiting_to_start %v completed_waiting %v during the load, want 0", gauge("waiting_to_start"), gauge("completed_waiting"))
	}
	e.ReportKV(KVCompletions{FinishedRecving: []string{h.ID}})
	r := collect(t, h)
	testutil.WaitFor(t, "the gauge back at 0", 10*time.Second, func() bool { return gauge("in_progress") == 0 })
	for _, st := range []string{"waiting_to_start", "in_progress", "completed_waiting"} {
		if n := observations(t, m.KVFetchStageSeconds.WithLabelValues(st)); n != 1 {
			t.Errorf("%s: %d observations, want 1", st, n)
		}
	}
	if len(r.timings) != 1 {
		t.Fatalf("%d timings, want 1", len(r.timings))
	}
	if tm := r.timings[0]; tm.KVLoad <= 0 || tm.KVReady <= 0 || tm.Prefill <= 0 {
		t.Errorf("timing %+v: want a load, a wait to run and a prefill", tm)
	}
	local := run(t, e, &Request{Prompt: g.GreedyIDs[:40], Params: greedy(2)})
	if n := observations(t, m.KVFetchStageSeconds.WithLabelValues("in_progress")); n != 1 || local.timings[0].KVReady != 0 {
		t.Errorf("a local request observed a fetch (%d) or a kv_ready (%v)", n, local.timings[0].KVReady)
	}
}

// TestCadenceCounters: with --prefill-schedule-interval 4, a prompt that
// arrives while a request decodes runs its chunks only on cadence steps,
// and the engine counts the steps the cadence deferred.
func TestCadenceCounters(t *testing.T) {
	e, m := newEngine(t, Config{PrefillScheduleInterval: 4, MaxNumBatchedTokens: 8})
	_, _, g := load(t)
	// The long request decodes until it is canceled (it may run up to the
	// model's 512 positions), so it is still decoding while the short
	// prompt's chunks are scheduled however late this goroutine gets to
	// submit that prompt.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	long, err := e.Submit(ctx, &Request{Prompt: g.GreedyIDs[:8], Params: greedy(500)})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-long.Events; len(ev.Tokens) == 0 {
		t.Fatalf("first event %+v, want a token", ev)
	}
	// Not a prefix of the long request's sequence (the golden greedy ids
	// are what it generates): a prompt whose first blocks the long request
	// has already cached is nearly all a prefix hit, which the cadence lets
	// through (sched's light-work rule), and the test then depended on how
	// far the long request had decoded when this goroutine submitted.
	prompt := slices.Clone(g.GreedyIDs[:60])
	slices.Reverse(prompt)
	short := run(t, e, &Request{Prompt: prompt, Params: greedy(2)})
	cancel()
	for range long.Events {
	}
	if len(short.tokens) != 2 {
		t.Fatalf("%d tokens, want 2", len(short.tokens))
	}
	if n := value(t, m.PrefillStepsDeferred); n == 0 {
		t.Error("tandem:prefill_steps_deferred_total is 0: the cadence deferred no chunk of a 60-token prompt in 8-token steps")
	}
}
