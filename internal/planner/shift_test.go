package planner

import (
	"strings"
	"testing"
	"time"
)

// TestShiftFitsTheRecentPart: a window of long prompts whose last quarter
// is chat is fitted to that quarter alone, and says why; a window of one
// mix is fitted whole.
func TestShiftFitsTheRecentPart(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Window: 20 * time.Second})
	end := feed(pl, t0, 15*time.Second, longPrompt, 4, 2)
	d := pl.Decide(end)
	if d.Fit.Shift != "" || d.Fit.Requests != 60 {
		t.Fatalf("one mix: shift %q, %d requests fitted, want none and all 60", d.Fit.Shift, d.Fit.Requests)
	}
	end = feed(pl, end, 5*time.Second, chat, 4, 2)
	d = pl.Decide(end)
	if !strings.Contains(d.Fit.Shift, "uncached prompt lengths") || d.Fit.Requests != 20 || d.Fit.MeanPrompt != float64(chat.prompt) {
		t.Fatalf("long then chat: shift %q, %d requests fitted, mean prompt %v; want the last 5 s of chat alone", d.Fit.Shift, d.Fit.Requests, d.Fit.MeanPrompt)
	}
	if d.Fit.ArrivalRate != chat.rate {
		t.Fatalf("arrival rate %v over the recent part, want %v", d.Fit.ArrivalRate, chat.rate)
	}
}

// TestShiftDecidesOnTheNewMixAlone: the requests since a shift are fewer
// than MinRequests; the decision is made from them (as many as the shift
// was judged on) rather than held until MinRequests of the new mix came.
func TestShiftDecidesOnTheNewMixAlone(t *testing.T) {
	pl := newPlanner(t, Config{Engines: 4, Prefill: 2, Window: 20 * time.Second, MinRequests: 40})
	end := feed(pl, t0, 15*time.Second, chat, 4, 2)
	end = feed(pl, end, 5*time.Second, longPrompt, 4, 2) // the window's last quarter
	d := pl.Decide(end)
	if d.Fit.Shift == "" || d.Fit.Requests != 20 || strings.Contains(d.Held, "too few") {
		t.Fatalf("shift %q, %d requests fitted, held %q: want a decision from the 20 requests since the shift", d.Fit.Shift, d.Fit.Requests, d.Held)
	}
}

// TestShiftMovesSeveralEnginesAtOnce: after a shift the best split is
// several engines away; a change then moves half the way (rounded up), not
// one engine, still never past the best and never twice within the step
// dwell; without a shift the split moves one engine per change.
func TestShiftMovesSeveralEnginesAtOnce(t *testing.T) {
	const n = 8
	cfg := Config{TTFT: 2 * time.Second, TPOT: 40 * time.Millisecond, Engines: n, Prefill: 1, MinPrefill: 1, MinDwell: 8 * time.Second, Window: 20 * time.Second}
	pl := newPlanner(t, cfg)
	now := feed(pl, t0, 30*time.Second, chat, n, 1)
	if d := pl.Decide(now); d.Prefill != 1 {
		t.Fatalf("chat: %dP, want the one prefill engine MinPrefill keeps", d.Prefill)
	}
	var moves []int
	var last time.Time
	for range 30 {
		p := pl.prefill
		now = feed(pl, now, time.Second, longPrompt, n, p)
		d := pl.Decide(now)
		if !d.Changed {
			continue
		}
		got, dist := d.Prefill-p, d.Best.P-p
		if d.Crossed || got <= 0 || got > dist {
			t.Fatalf("%dP → %dP with the best at %dP (crossed %v): want a move toward the best, not past it", p, d.Prefill, d.Best.P, d.Crossed)
		}
		want := 1
		if d.Fit.Shift != "" {
			want = (dist + 1) / 2
		}
		if got != want {
			t.Fatalf("%dP → %dP with the best at %dP (shift %q): moved %d engines, want %d", p, d.Prefill, d.Best.P, d.Fit.Shift, got, want)
		}
		if !last.IsZero() && now.Sub(last) < pl.Config().StepDwell {
			t.Fatalf("two changes %v apart, within the step dwell %v", now.Sub(last), pl.Config().StepDwell)
		}
		last = now
		moves = append(moves, got)
	}
	if len(moves) == 0 || moves[0] < 2 {
		t.Fatalf("moves %v: want the first move after the shift to take several engines", moves)
	}
	if pl.prefill <= 4 {
		t.Fatalf("long prompts: %dP after 30 s, want more than 4", pl.prefill)
	}
	t.Logf("moves after the shift: %v, at %dP", moves, pl.prefill)
}
