package testutil

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the calling goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runRecorded runs f on its own goroutine with a fatalRecorder and returns
// the message it failed with ("" if it did not).
func runRecorded(f func(testing.TB)) string {
	r := &fatalRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

func TestWaitFor(t *testing.T) {
	t.Run("returns once the condition holds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			calls := 0
			msg := runRecorded(func(tb testing.TB) {
				WaitFor(tb, "the fifth call", time.Minute, func() bool { calls++; return calls == 5 })
			})
			if msg != "" || calls != 5 {
				t.Fatalf("failed with %q after %d calls, want success on the fifth", msg, calls)
			}
			if d := time.Since(start); d >= maxPoll*4 {
				t.Errorf("took %v of fake time for four retries; the first polls should be quick", d)
			}
		})
	})
	t.Run("a condition true at once costs no sleep", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			WaitFor(t, "nothing", time.Second, func() bool { return true })
			if d := time.Since(start); d != 0 {
				t.Errorf("slept %v", d)
			}
		})
	})
	t.Run("fails with what it waited for at the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			msg := runRecorded(func(tb testing.TB) {
				WaitFor(tb, "the moon", 3*time.Second, func() bool { return false })
			})
			if want := "waited 3s for the moon"; msg != want {
				t.Errorf("failed with %q, want %q", msg, want)
			}
			if d := time.Since(start); d != 3*time.Second {
				t.Errorf("gave up after %v of fake time, want exactly the 3 s limit", d)
			}
		})
	})
	t.Run("a condition that came true during the last sleep passes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			deadline := time.Now().Add(time.Second)
			msg := runRecorded(func(tb testing.TB) {
				WaitFor(tb, "the deadline", time.Second, func() bool { return !time.Now().Before(deadline) })
			})
			if msg != "" {
				t.Errorf("failed with %q", msg)
			}
		})
	})
	t.Run("polls no slower than maxPoll", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var gaps []time.Duration
			last := time.Now()
			runRecorded(func(tb testing.TB) {
				WaitFor(tb, "a while", time.Second, func() bool {
					gaps = append(gaps, time.Since(last))
					last = time.Now()
					return false
				})
			})
			for i, g := range gaps {
				if g > maxPoll {
					t.Fatalf("gap %d was %v, over %v (gaps %v)", i, g, maxPoll, gaps)
				}
			}
			if len(gaps) < 20 || len(gaps) > 40 {
				t.Errorf("%d polls in 1 s, want about 1 s / %v", len(gaps), maxPoll)
			}
		})
	})
	t.Run("the failure names the limit and the awaited state", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			msg := runRecorded(func(tb testing.TB) {
				WaitFor(tb, "every KV block back in the pool", 10*time.Millisecond, func() bool { return false })
			})
			if !strings.Contains(msg, "10ms") || !strings.Contains(msg, "every KV block back in the pool") {
				t.Errorf("message %q", msg)
			}
		})
	})
}
