package sched

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSetPrefillScheduleIntervalBetweenSteps changes the cadence of a
// running scheduler and checks the step trace around the change.
func TestSetPrefillScheduleIntervalBetweenSteps(t *testing.T) {
	cases := []struct {
		name     string
		from, to int
		want     [][]string // the steps after the change; b arrives just before it
	}{
		{
			name: "lowering it lets a deferred prompt in at the new interval",
			from: 4, to: 2,
			want: [][]string{
				{"a@9+1", "b@0+8"}, // 1 step since a's prefill + this one: on the new cadence
				{"a@10+1", "b@8+1"},
			},
		},
		{
			name: "raising it counts the decode steps already taken",
			from: 2, to: 4,
			want: [][]string{
				{"a@9+1"},
				{"a@10+1"},
				{"a@11+1", "b@0+8"}, // the 4th step since a's prefill
				{"a@12+1", "b@8+1"},
			},
		},
		{
			name: "to 1 prefills on every step again",
			from: 4, to: 1,
			want: [][]string{
				{"a@9+1", "b@0+8"},
				{"a@10+1", "b@8+1"},
			},
		},
		{
			name: "from 1 the first step is on cadence",
			from: 1, to: 3,
			want: [][]string{
				{"a@9+1", "b@0+8"},
				{"a@10+1", "b@8+1"},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, 32, Config{PrefillScheduleInterval: c.from}, nil)
			a := h.add("a", prompt(1, 8), 16)
			// a's prefill, then one decode step in which nothing waits.
			if diff := cmp.Diff([][]string{{"a@0+8"}, {"a@8+1"}}, h.trace(2)); diff != "" {
				t.Fatalf("before the change (-want +got):\n%s", diff)
			}
			b := h.add("b", prompt(2, 8), 4)
			if err := h.s.SetPrefillScheduleInterval(c.to); err != nil {
				t.Fatal(err)
			}
			if got := h.s.Config().PrefillScheduleInterval; got != c.to {
				t.Fatalf("Config().PrefillScheduleInterval = %d, want %d", got, c.to)
			}
			if diff := cmp.Diff(c.want, h.trace(len(c.want))); diff != "" {
				t.Errorf("after %d → %d (-want +got):\n%s", c.from, c.to, diff)
			}
			h.runAll(50)
			for _, r := range []*Request{a, b} {
				if diff := cmp.Diff(want(r.Prompt, r.MaxTokens), r.Output()); diff != "" {
					t.Errorf("%s output (-want +got):\n%s", r.ID, diff)
				}
			}
		})
	}
	t.Run("the clock runs on at the new interval", func(t *testing.T) {
		h := newHarness(t, 32, Config{}, nil)
		h.add("a", prompt(1, 8), 16)
		h.trace(2)
		if err := h.s.SetPrefillScheduleInterval(3); err != nil {
			t.Fatal(err)
		}
		h.add("b", prompt(2, 8), 8)
		h.trace(1) // b's prefill, on cadence
		h.add("c", prompt(3, 8), 4)
		wantSteps := [][]string{
			{"a@10+1", "b@8+1"},
			{"a@11+1", "b@9+1"},
			{"a@12+1", "b@10+1", "c@0+8"},
		}
		if diff := cmp.Diff(wantSteps, h.trace(3)); diff != "" {
			t.Errorf("schedule (-want +got):\n%s", diff)
		}
		h.runAll(50)
	})
}

func TestSetPrefillScheduleIntervalRefusesOutOfRange(t *testing.T) {
	h := newHarness(t, 8, Config{PrefillScheduleInterval: 3}, nil)
	for _, n := range []int{-1, MaxPrefillScheduleInterval + 1, 1 << 30} {
		err := h.s.SetPrefillScheduleInterval(n)
		if err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("SetPrefillScheduleInterval(%d) = %v, want an out-of-range error", n, err)
		}
	}
	if got := h.s.Config().PrefillScheduleInterval; got != 3 {
		t.Errorf("after refused changes the interval is %d, want 3 as it was", got)
	}
	if err := h.s.SetPrefillScheduleInterval(0); err != nil || h.s.Config().PrefillScheduleInterval != 1 {
		t.Errorf("SetPrefillScheduleInterval(0) = %v, interval %d; want nil and 1 (every step)", err, h.s.Config().PrefillScheduleInterval)
	}
}
