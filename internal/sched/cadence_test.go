package sched

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// trace runs n steps and returns each step's schedule.
func (h *harness) trace(n int) [][]string {
	h.t.Helper()
	var got [][]string
	for range n {
		got = append(got, ids(h.step().Scheduled))
	}
	return got
}

func TestPrefillCadence(t *testing.T) {
	t.Run("off-cadence steps defer a new prompt while a request decodes", func(t *testing.T) {
		h := newHarness(t, 32, Config{PrefillScheduleInterval: 3}, nil)
		a := h.add("a", prompt(1, 8), 8)
		got := h.trace(1)
		b := h.add("b", prompt(2, 8), 4)
		got = append(got, h.trace(4)...)
		wantSteps := [][]string{
			{"a@0+8"},
			{"a@8+1"},           // 1 step after a's prefill: b waits
			{"a@9+1"},           // 2 steps after
			{"a@10+1", "b@0+8"}, // the 3rd: on cadence
			{"a@11+1", "b@8+1"}, // b decodes: decodes are never deferred
		}
		if diff := cmp.Diff(wantSteps, got); diff != "" {
			t.Errorf("schedule (-want +got):\n%s", diff)
		}
		if st := h.s.Stats(); st.PrefillDeferredSteps != 2 || st.CadenceLiftedSteps != 0 {
			t.Errorf("deferred %d lifted %d, want 2 and 0", st.PrefillDeferredSteps, st.CadenceLiftedSteps)
		}
		h.runAll(50)
		for _, r := range []*Request{a, b} {
			if diff := cmp.Diff(want(r.Prompt, r.MaxTokens), r.Output()); diff != "" {
				t.Errorf("%s output (-want +got):\n%s", r.ID, diff)
			}
		}
	})
	t.Run("continuing chunks are deferred too", func(t *testing.T) {
		h := newHarness(t, 32, Config{PrefillScheduleInterval: 2, MaxNumBatchedTokens: 6}, nil)
		h.add("a", prompt(1, 3), 8) // light: 3 tokens
		h.step()
		h.add("b", prompt(2, 12), 2)
		wantSteps := [][]string{
			{"a@3+1", "b@0+5"}, // a's admission was light: the clock still allows prefill
			{"a@4+1"},          // b's next chunk waits a step
			{"a@5+1", "b@5+5"},
			{"a@6+1", "b@10+2"}, // off cadence, but b's last 2 tokens are light
			{"a@7+1", "b@12+1"},
			{"a@8+1"},
		}
		if diff := cmp.Diff(wantSteps, h.trace(6)); diff != "" {
			t.Errorf("schedule (-want +got):\n%s", diff)
		}
		h.runAll(50)
	})
	t.Run("with nothing decoding prefill runs on every step", func(t *testing.T) {
		h := newHarness(t, 32, Config{PrefillScheduleInterval: 4, MaxNumBatchedTokens: 6}, nil)
		h.add("a", prompt(1, 20), 2)
		wantSteps := [][]string{{"a@0+6"}, {"a@6+6"}, {"a@12+6"}, {"a@18+2"}, {"a@20+1"}}
		if diff := cmp.Diff(wantSteps, h.trace(5)); diff != "" {
			t.Errorf("schedule (-want +got):\n%s", diff)
		}
		if st := h.s.Stats(); st.PrefillDeferredSteps != 0 {
			t.Errorf("%d deferred steps, want none: the interval never leaves the engine idle", st.PrefillDeferredSteps)
		}
		h.runAll(50)
	})
	t.Run("interval 1 is today's schedule", func(t *testing.T) {
		for _, iv := range []int{0, 1} {
			h := newHarness(t, 32, Config{PrefillScheduleInterval: iv}, nil)
			h.add("a", prompt(1, 8), 4)
			h.step()
			h.add("b", prompt(2, 8), 4)
			if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"a@8+1", "b@0+8"}) {
				t.Errorf("interval %d: %v, want b admitted at once", iv, got)
			}
			h.runAll(50)
		}
	})
	t.Run("a near-total prefix hit is light and goes through off cadence", func(t *testing.T) {
		h := newHarness(t, 32, Config{PrefillScheduleInterval: 4}, nil)
		p := prompt(3, 10)
		h.add("warm", p, 1)
		h.runAll(10)
		h.add("a", prompt(1, 8), 8)
		h.step()
		h.add("hit", p, 2) // 8 of 10 tokens cached: 2 left
		got := ids(h.step().Scheduled)
		if !cmp.Equal(got, []string{"a@8+1", "hit@8+2"}) {
			t.Errorf("off-cadence step %v, want the near-total hit admitted", got)
		}
		if h.s.sincePrefill != 1 {
			t.Errorf("clock %d steps after the light admission, want 1: light work does not restart it", h.s.sincePrefill)
		}
		h.runAll(50)
	})
}

func TestCadenceGuard(t *testing.T) {
	t.Run("an admitting step that leaves requests waiting lifts the next off-cadence step", func(t *testing.T) {
		h := newHarness(t, 64, Config{PrefillScheduleInterval: 3, MaxNumBatchedTokens: 10}, nil)
		h.add("a", prompt(1, 8), 12)
		h.step() // a@0+8: nothing left waiting, the guard stays off
		h.add("b", prompt(2, 8), 12)
		h.add("c", prompt(3, 8), 12)
		h.add("d", prompt(4, 8), 12)
		wantSteps := [][]string{
			{"a@8+1"},                             // off cadence, guard off: deferred
			{"a@9+1"},                             // deferred
			{"a@10+1", "b@0+8", "c@0+1"},          // on cadence; c and d still wait: guard on
			{"a@11+1", "b@8+1", "c@1+7", "d@0+1"}, // off cadence, lifted; d admitted, nothing waits: guard off
			{"a@12+1", "b@9+1", "c@8+1"},          // off cadence: d's chunk deferred
			{"a@13+1", "b@10+1", "c@9+1"},
			{"a@14+1", "b@11+1", "c@10+1", "d@1+7"},
		}
		if diff := cmp.Diff(wantSteps, h.trace(7)); diff != "" {
			t.Errorf("schedule (-want +got):\n%s", diff)
		}
		if st := h.s.Stats(); st.PrefillDeferredSteps != 4 || st.CadenceLiftedSteps != 1 {
			t.Errorf("deferred %d lifted %d, want 4 and 1", st.PrefillDeferredSteps, st.CadenceLiftedSteps)
		}
		h.runAll(100)
	})
	t.Run("at saturation the guard keeps every step admitting until the queue drains", func(t *testing.T) {
		// Each admitting step leaves requests waiting, so the guard lifts
		// every off-cadence step; with interval 4 and no guard only one
		// step in four would admit and the queue would grow.
		h := newHarness(t, 256, Config{PrefillScheduleInterval: 4, MaxNumBatchedTokens: 20}, nil)
		h.add("a", prompt(1, 8), 60)
		h.step()
		for i := range 12 {
			h.add(string(rune('b'+i)), prompt(2+i, 8), 40)
		}
		h.trace(3) // deferred: a's admission left nothing waiting
		for n := 0; h.s.Stats().Waiting > 0; n++ {
			if n > 20 {
				t.Fatalf("the queue did not drain in 20 steps: %+v", h.s.Stats())
			}
			h.step()
		}
		if st := h.s.Stats(); st.PrefillDeferredSteps != 3 || st.CadenceLiftedSteps == 0 {
			t.Errorf("deferred %d lifted %d, want 3 (before the first admission: none while the queue is not empty) and some", st.PrefillDeferredSteps, st.CadenceLiftedSteps)
		}
		h.runAll(400)
	})
	t.Run("a preempting step leaves the guard as it was", func(t *testing.T) {
		// a and b fill the pool as they decode; c waits for memory.
		h := newHarness(t, 8, Config{PrefillScheduleInterval: 2}, nil)
		h.add("a", prompt(1, 12), 10)
		h.add("b", prompt(2, 12), 10)
		h.add("c", prompt(3, 12), 10)
		for !h.s.capacityBound {
			if !h.s.HasWork() {
				t.Fatal("the guard never set")
			}
			h.step()
		}
		for n := 0; ; n++ {
			if n > 100 {
				t.Fatal("no preemption")
			}
			out := h.step()
			if len(out.Preempted) > 0 {
				if !h.s.capacityBound {
					t.Error("a preempting step cleared the guard")
				}
				break
			}
		}
		h.runAll(400)
	})
}
