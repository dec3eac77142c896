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
