package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseServerTiming(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   map[string]float64
	}{
		{"an engine's entries", []string{"queue;dur=1.204, kv_pull;dur=35.871, prefill;dur=12.530"},
			map[string]float64{"queue": 1.204, "kv_pull": 35.871, "prefill": 12.53}},
		{"several header lines add up", []string{"queue;dur=1", "prefill_leg;dur=900.5, proxy;dur=0.25"},
			map[string]float64{"queue": 1, "prefill_leg": 900.5, "proxy": 0.25}},
		{"a name given twice adds up", []string{"queue;dur=1, queue;dur=2"}, map[string]float64{"queue": 3}},
		{"desc before dur, a quoted comma and semicolon, odd spaces", []string{`db ; desc="a, b; c" ; DUR = 53 , cache;dur="2.5"`},
			map[string]float64{"db": 53, "cache": 2.5}},
		{"the first dur counts", []string{"x;dur=1;dur=2"}, map[string]float64{"x": 1}},
		{"entries without a usable dur are skipped", []string{"miss, bad;dur=abc, neg;dur=-1, inf;dur=Inf, na me;dur=3, ok;dur=0"},
			map[string]float64{"ok": 0}},
		{"nothing", nil, nil},
		{"an empty header", []string{""}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParseServerTiming(tc.values)); diff != "" {
				t.Errorf("ParseServerTiming(%q) (-want +got):\n%s", tc.values, diff)
			}
		})
	}
}

// FuzzParseServerTiming: a server's header, whatever it is, never panics
// the benchmark and gives only finite, non-negative durations by token
// names.
func FuzzParseServerTiming(f *testing.F) {
	for _, s := range []string{"queue;dur=1.2, prefill;dur=3", `a;desc="x,\"y";dur=1`, `;;,,"`, "x;dur=1e308, x;dur=1e308"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, d := range ParseServerTiming([]string{s}) {
			if !isToken(name) || d < 0 || math.IsNaN(d) || math.IsInf(d, 0) {
				t.Errorf("%q gave %q = %v", s, name, d)
			}
		}
	})
}

func TestBreakdownByHand(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		// Remote: 2 + 60 + 1 + 20 + 7 = 90 of a 100 ms TTFT: rest 10.
		{TTFT: 100 * ms, Timing: map[string]float64{"proxy": 2, "prefill_leg": 60, "queue": 1, "kv_pull": 20, "prefill": 7}},
		// Local (no prefill leg, no KV pull): 4 + 10 + 30 of 50 ms: rest 6.
		{TTFT: 50 * ms, Timing: map[string]float64{"proxy": 4, "queue": 10, "prefill": 30}},
		{TTFT: 5 * ms, Err: "HTTP 500", Timing: map[string]float64{"queue": 1000}}, // failed: left out
		{TTFT: 70 * ms}, // no header: left out
	}
	b := NewBreakdown(recs)
	// Over two values x < y the mean is (x+y)/2 and p90 x + 0.9(y-x).
	want := &Breakdown{N: 2, TTFT: Span{"ttft", 75, 95}, Spans: []Span{
		{"proxy", 3, 3.8}, {"prefill_leg", 30, 54}, {"queue", 5.5, 9.1}, {"kv_pull", 10, 18}, {"prefill", 18.5, 27.7}, {RestSpan, 8, 9.6},
	}}
	if diff := cmp.Diff(want, b, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("breakdown (-want +got):\n%s", diff)
	}
	var sum float64
	for _, s := range b.Spans {
		sum += s.Mean
	}
	if math.Abs(sum-b.TTFT.Mean) > 1e-9 {
		t.Errorf("the span means add up to %v, not the TTFT mean %v", sum, b.TTFT.Mean)
	}
	if NewBreakdown(recs[2:]) != nil {
		t.Error("a breakdown without any Server-Timing")
	}
	var out strings.Builder
	s := &Suite{Results: []*Result{{Target: "pd", Load: Load{Rate: 1}, Breakdown: b}, {Target: "colocated", Load: Load{Rate: 1}}}}
	if err := WriteBreakdowns(&out, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"prefill_leg", "kv_pull", "rest", "30.0 / 54.0", "75 / 95"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "colocated") {
		t.Errorf("a result without a breakdown has a row:\n%s", out.String())
	}
}
