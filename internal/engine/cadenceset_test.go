package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestSetPrefillScheduleIntervalAtRunTime starts an engine without a
// cadence, sets one while a request decodes, and checks that the next
// prompt's chunks are deferred under it, that the gauge follows, and that
// setting 1 again stops the deferring.
func TestSetPrefillScheduleIntervalAtRunTime(t *testing.T) {
	e, m := newEngine(t, Config{MaxNumBatchedTokens: 8})
	_, _, g := load(t)
	if got := value(t, m.PrefillScheduleInterval); got != 1 || e.PrefillScheduleInterval() != 1 {
		t.Fatalf("at start: gauge %v, PrefillScheduleInterval %d; want 1", got, e.PrefillScheduleInterval())
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	long, err := e.Submit(ctx, &Request{Prompt: g.GreedyIDs[:8], Params: greedy(500)})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-long.Events; len(ev.Tokens) == 0 {
		t.Fatalf("first event %+v, want a token", ev)
	}
	// Not a prefix of the long request's sequence (see TestCadenceCounters).
	prompt := slices.Clone(g.GreedyIDs[:60])
	slices.Reverse(prompt)
	short := func() {
		t.Helper()
		if r := run(t, e, &Request{Prompt: prompt, Params: greedy(2)}); len(r.tokens) != 2 {
			t.Fatalf("%d tokens, want 2", len(r.tokens))
		}
	}
	short()
	if n := value(t, m.PrefillStepsDeferred); n != 0 {
		t.Fatalf("%v steps deferred at interval 1, want 0", n)
	}

	prev, err := e.SetPrefillScheduleInterval(t.Context(), 4)
	if err != nil || prev != 1 {
		t.Fatalf("SetPrefillScheduleInterval(4) = %d, %v; want 1, nil", prev, err)
	}
	if got := value(t, m.PrefillScheduleInterval); got != 4 || e.PrefillScheduleInterval() != 4 {
		t.Fatalf("after the change: gauge %v, PrefillScheduleInterval %d; want 4", got, e.PrefillScheduleInterval())
	}
	prompt[0]++ // not a prefix-cache hit of the first run
	short()
	deferred := value(t, m.PrefillStepsDeferred)
	if deferred == 0 {
		t.Fatal("tandem:prefill_steps_deferred_total is 0 after the interval was set to 4: the cadence deferred no chunk of a 60-token prompt in 8-token steps")
	}

	if prev, err := e.SetPrefillScheduleInterval(t.Context(), 1); err != nil || prev != 4 {
		t.Fatalf("SetPrefillScheduleInterval(1) = %d, %v; want 4, nil", prev, err)
	}
	prompt[0]++
	short()
	if n := value(t, m.PrefillStepsDeferred); n != deferred {
		t.Errorf("%v steps deferred after the interval went back to 1, want %v as before", n, deferred)
	}
	cancel()
	for range long.Events {
	}
}

func TestSetPrefillScheduleIntervalRefusals(t *testing.T) {
	e, m := newEngine(t, Config{PrefillScheduleInterval: 3})
	for _, n := range []int{0, -2, MaxPrefillScheduleInterval + 1} {
		_, err := e.SetPrefillScheduleInterval(t.Context(), n)
		var ire *InvalidRequestError
		if !errors.As(err, &ire) || ire.Param != "prefill_schedule_interval" {
			t.Errorf("SetPrefillScheduleInterval(%d) = %v, want an *InvalidRequestError on prefill_schedule_interval", n, err)
		}
	}
	if got := value(t, m.PrefillScheduleInterval); got != 3 || e.PrefillScheduleInterval() != 3 {
		t.Errorf("after refusals: gauge %v, PrefillScheduleInterval %d; want 3 as it was", got, e.PrefillScheduleInterval())
	}
	if err := e.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetPrefillScheduleInterval(t.Context(), 2); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("after Shutdown: %v, want ErrShuttingDown", err)
	}
}
