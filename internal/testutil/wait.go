package testutil

import (
	"testing"
	"time"
)

// Polling intervals of WaitFor: the first retry comes soon, so a condition
// that is nearly true costs little, and the interval doubles up to
// maxPoll, so a slow one does not spin on a loaded machine.
const (
	firstPoll = time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// WaitFor polls cond until it returns true, and fails the test (t.Fatalf,
// so call it from the test's goroutine) when it is still false after limit,
// saying "waited <limit> for <what>". what names the awaited state, as in
// "every KV block back in the pool". cond is called once more at the
// deadline, so a condition that came true during the last sleep passes.
//
// Use it in place of a sleep that a later assertion depends on. Under
// testing/synctest the sleeps and the deadline run on the bubble's fake
// clock.
func WaitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for wait := firstPoll; !cond(); wait = min(2*wait, maxPoll) {
		left := time.Until(deadline)
		if left <= 0 {
			if cond() {
				return
			}
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(min(wait, left))
	}
}
