package engine

import (
	"context"
	"fmt"

	"github.com/tandem-serve/tandem/internal/sched"
)

// MaxPrefillScheduleInterval is the largest prefill cadence
// SetPrefillScheduleInterval accepts.
const MaxPrefillScheduleInterval = sched.MaxPrefillScheduleInterval

// setCadenceMsg asks the step loop to change the prefill cadence between
// two steps; the loop answers the previous interval on done.
type setCadenceMsg struct {
	n    int
	done chan<- cadenceChange
}

type cadenceChange struct {
	prev int
	err  error
}

// PrefillScheduleInterval returns the prefill cadence in use (1: prefill
// on every step).
func (e *Engine) PrefillScheduleInterval() int { return int(e.cadence.Load()) }

// SetPrefillScheduleInterval changes the prefill cadence (Config's
// PrefillScheduleInterval) without a restart: the step loop applies it
// between two steps, keeping the count of steps since the last prefill
// (package sched, "Prefill cadence"). It returns the interval it replaced.
// n must be 1 to MaxPrefillScheduleInterval (an *InvalidRequestError
// otherwise); an engine that has stopped answers ErrShuttingDown.
func (e *Engine) SetPrefillScheduleInterval(ctx context.Context, n int) (prev int, err error) {
	if n < 1 || n > MaxPrefillScheduleInterval {
		return 0, &InvalidRequestError{Param: "prefill_schedule_interval",
			Message: fmt.Sprintf("%d is out of range: send 1 (prefill on every step) to %d", n, MaxPrefillScheduleInterval)}
	}
	done := make(chan cadenceChange, 1)
	e.in.post(setCadenceMsg{n: n, done: done})
	select {
	case c := <-done:
		return c.prev, c.err
	case <-e.done:
		return 0, ErrShuttingDown
	case <-ctx.Done():
		return 0, fmt.Errorf("engine: the step loop did not take the new prefill cadence in time (it applies it at its next step): %w", ctx.Err())
	}
}

// setCadence runs on the step loop.
func (e *Engine) setCadence(m setCadenceMsg) {
	prev := e.sched.Config().PrefillScheduleInterval
	if err := e.sched.SetPrefillScheduleInterval(m.n); err != nil {
		m.done <- cadenceChange{err: fmt.Errorf("engine: %w", err)}
		return
	}
	e.publishCadence()
	if prev != m.n {
		e.log.Info("prefill cadence changed", "prefill_schedule_interval", m.n, "previous", prev)
	}
	m.done <- cadenceChange{prev: prev}
}

// publishCadence refreshes PrefillScheduleInterval and its gauge from the
// scheduler.
func (e *Engine) publishCadence() {
	n := e.sched.Config().PrefillScheduleInterval
	e.cadence.Store(int64(n))
	if e.m != nil && e.m.PrefillScheduleInterval != nil {
		e.m.PrefillScheduleInterval.Set(float64(n))
	}
}
