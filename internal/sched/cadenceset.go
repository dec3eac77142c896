package sched

import "fmt"

// MaxPrefillScheduleInterval bounds the prefill cadence a running
// scheduler accepts (SetPrefillScheduleInterval): past a few dozen decode
// steps between prefills a new request's TTFT is dominated by the wait,
// whatever the objectives.
const MaxPrefillScheduleInterval = 64

// SetPrefillScheduleInterval changes the prefill cadence between two steps
// (Config.PrefillScheduleInterval; 0 means 1, every step). It takes effect
// at the next Schedule. The step count since the last prefill is kept, and
// clamped to the new interval, so a lower interval never holds a prefill
// back longer than the new interval asks, and a higher one counts the
// decode steps already taken. An engine that ran without a cadence (1) had
// no clock: its first step under the new interval is on cadence, and the
// capacity-bound guard starts clear.
func (s *Scheduler) SetPrefillScheduleInterval(n int) error {
	if n == 0 {
		n = 1
	}
	if n < 1 || n > MaxPrefillScheduleInterval {
		return fmt.Errorf("sched: prefill schedule interval %d is out of range: use 1 (prefill on every step) to %d", n, MaxPrefillScheduleInterval)
	}
	if s.cfg.PrefillScheduleInterval <= 1 {
		s.sincePrefill, s.capacityBound = n, false
	} else {
		s.sincePrefill = min(s.sincePrefill, n)
	}
	s.cfg.PrefillScheduleInterval = n
	return nil
}
