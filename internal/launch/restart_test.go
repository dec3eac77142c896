package launch

import (
	"testing"
	"time"
)

func TestRestartTrackerBacksOffAndGivesUp(t *testing.T) {
	p := RestartPolicy{Limit: 3, Window: time.Minute, Backoff: time.Second, MaxBackoff: 3 * time.Second}
	p.setDefaults()
	tr := restartTracker{policy: p}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration // after t0
		wait time.Duration
		ok   bool
	}{
		{0, time.Second, true},
		{2 * time.Second, 2 * time.Second, true},
		{5 * time.Second, 3 * time.Second, true}, // 4s capped at MaxBackoff
		{9 * time.Second, 0, false},              // a fourth restart within the minute: give up
		// The first restart leaves the window 60s after it: one more is allowed,
		// after a backoff for the two still in it.
		{61 * time.Second, 3 * time.Second, true},
	}
	for i, s := range steps {
		wait, ok := tr.exited(t0.Add(s.at))
		if wait != s.wait || ok != s.ok {
			t.Errorf("exit %d at +%v: wait %v ok %t, want %v %t", i, s.at, wait, ok, s.wait, s.ok)
		}
	}
	if tr.total != 4 {
		t.Errorf("total restarts %d, want 4", tr.total)
	}
}

func TestRestartTrackerForgetsOldRestarts(t *testing.T) {
	p := RestartPolicy{}
	p.setDefaults()
	tr := restartTracker{policy: p}
	now := time.Unix(0, 0)
	// An engine that exits once an hour is restarted every time, after the
	// first backoff.
	for i := range 100 {
		wait, ok := tr.exited(now.Add(time.Duration(i) * time.Hour))
		if !ok || wait != DefaultRestartBackoff {
			t.Fatalf("hourly exit %d: wait %v ok %t, want %v true", i, wait, ok, DefaultRestartBackoff)
		}
	}
}

func TestRestartTrackerOffAndHugeBackoffs(t *testing.T) {
	off := restartTracker{policy: RestartPolicy{Limit: -1}}
	off.policy.setDefaults()
	if _, ok := off.exited(time.Now()); ok {
		t.Error("Limit -1 restarted an engine")
	}
	// Doubling a large backoff many times must cap, not overflow.
	big := restartTracker{policy: RestartPolicy{Limit: 100, Window: 1000 * time.Hour, Backoff: time.Hour, MaxBackoff: 200 * time.Hour}}
	now := time.Unix(0, 0)
	var wait time.Duration
	for i := range 80 {
		var ok bool
		wait, ok = big.exited(now.Add(time.Duration(i) * time.Second))
		if !ok || wait <= 0 || wait > 200*time.Hour {
			t.Fatalf("exit %d: wait %v ok %t", i, wait, ok)
		}
	}
	if wait != 200*time.Hour {
		t.Errorf("wait after 80 restarts %v, want the cap 200h", wait)
	}
}
