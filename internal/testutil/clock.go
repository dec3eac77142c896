package testutil

import (
	"sync"
	"time"
)

// FakeClock is a clock.Clock that moves only when told to: Set and Advance
// move it, and Step makes every reading move it. It is safe for concurrent
// use, so a test can advance it while the code under test reads it. Tests
// of code that also sleeps or sets timers want testing/synctest instead,
// whose fake clock drives time.Sleep and time.Timer too.
type FakeClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

// NewFakeClock returns a FakeClock that reads start until it is moved.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's time, after moving it by the step if one is set.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

// Advance moves the clock forward by d (back, when d is negative).
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Step makes every later Now move the clock forward by d before reading it,
// so that successive readings differ by d (0, the default, stops that): a
// stand-in for the time that passes between the events a test replays.
func (c *FakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.step = d
	c.mu.Unlock()
}
