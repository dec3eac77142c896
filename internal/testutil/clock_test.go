package testutil

import (
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/clock"
)

var _ clock.Clock = (*FakeClock)(nil)

func TestFakeClock(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	t.Run("reads its start until moved", func(t *testing.T) {
		c := NewFakeClock(start)
		if got := c.Now(); !got.Equal(start) {
			t.Fatalf("Now() = %v, want %v", got, start)
		}
		if got := c.Now(); !got.Equal(start) {
			t.Fatalf("second Now() = %v, want %v", got, start)
		}
	})
	t.Run("Advance and Set move it", func(t *testing.T) {
		c := NewFakeClock(start)
		c.Advance(29 * time.Second)
		if got := c.Now(); !got.Equal(start.Add(29 * time.Second)) {
			t.Fatalf("after Advance(29s): %v", got)
		}
		c.Advance(-time.Second)
		if got := c.Now(); !got.Equal(start.Add(28 * time.Second)) {
			t.Fatalf("after Advance(-1s): %v", got)
		}
		c.Set(start)
		if got := c.Now(); !got.Equal(start) {
			t.Fatalf("after Set(start): %v", got)
		}
	})
	t.Run("Step moves it on every reading", func(t *testing.T) {
		c := NewFakeClock(start)
		c.Step(time.Millisecond)
		for i := 1; i <= 3; i++ {
			if got, want := c.Now(), start.Add(time.Duration(i)*time.Millisecond); !got.Equal(want) {
				t.Fatalf("reading %d: %v, want %v", i, got, want)
			}
		}
		c.Step(0)
		if a, b := c.Now(), c.Now(); !a.Equal(b) {
			t.Fatalf("after Step(0) readings differ: %v, %v", a, b)
		}
	})
	t.Run("is safe for concurrent use", func(t *testing.T) {
		c := NewFakeClock(start)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 100 {
					c.Advance(time.Second)
					c.Now()
				}
			})
		}
		wg.Wait()
		if got := c.Now(); !got.Equal(start.Add(400 * time.Second)) {
			t.Fatalf("after 400 concurrent Advance(1s): %v", got)
		}
	})
}
