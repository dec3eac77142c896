package sched

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestStall checks HasWork's promise to the step loop: false while every
// waiting request is blocked on memory (so the loop sleeps), true again as
// soon as an input might unblock one, and never false while Schedule could
// still make progress on its own.
func TestStall(t *testing.T) {
	// blocked returns a harness whose 4-block pool has 3 blocks held by a
	// finished request p (its remote decode has not read them yet) and a
	// waiting request b that needs 2.
	blocked := func(t *testing.T) (*harness, *Request) {
		t.Helper()
		c := newTestConnector()
		h := newHarness(t, 4, Config{}, c)
		c.delayFree["p"] = true
		h.add("p", prompt(1, 9), 1)
		h.step()
		if st := h.s.Stats(); st.Held != 1 || h.pool.FreeBlocks() != 1 {
			t.Fatalf("setup: stats %+v with %d free blocks, want p held and 1 free", st, h.pool.FreeBlocks())
		}
		b := h.add("b", prompt(2, 8), 2)
		if !h.s.HasWork() {
			t.Fatal("HasWork() false right after Add: a new request was never tried")
		}
		if out := h.step(); len(out.Scheduled) != 0 {
			t.Fatalf("b scheduled %v without memory", ids(out.Scheduled))
		}
		if h.s.HasWork() {
			t.Fatal("HasWork() true with only a request blocked on held blocks: the engine would spin")
		}
		return h, b
	}

	t.Run("a blocked request runs once the connector frees the held blocks", func(t *testing.T) {
		h, b := blocked(t)
		h.s.UpdateFromConnector(nil, []string{"p"}, nil)
		if !h.s.HasWork() {
			t.Fatal("HasWork() false after finished_sending freed blocks")
		}
		h.runAll(10)
		if diff := cmp.Diff(want(b.Prompt, 2), b.Output()); diff != "" {
			t.Errorf("b output (-want +got):\n%s", diff)
		}
	})
	t.Run("an input that frees nothing wakes the scheduler for one look only", func(t *testing.T) {
		h, _ := blocked(t)
		h.s.UpdateFromConnector(nil, []string{"unknown"}, nil)
		if !h.s.HasWork() {
			t.Fatal("HasWork() false after a connector report")
		}
		h.step()
		if h.s.HasWork() {
			t.Fatal("HasWork() true after a Schedule that changed nothing")
		}
		h.add("c", prompt(3, 4), 1) // behind b in FCFS order: still blocked
		h.step()
		if h.s.HasWork() {
			t.Fatal("HasWork() true with two blocked requests")
		}
		h.s.UpdateFromConnector(nil, []string{"p"}, nil)
		h.runAll(20)
	})
	t.Run("aborting the blocked request reports it", func(t *testing.T) {
		h, b := blocked(t)
		h.s.Abort(b.ID)
		if !h.s.HasWork() {
			t.Fatal("HasWork() false with an abort to report")
		}
		h.step()
		if f := h.finished["b"]; f.Status != FinishedAborted {
			t.Errorf("b finished %v, want FINISHED_ABORTED", f.Status)
		}
		h.s.UpdateFromConnector(nil, []string{"p"}, nil)
		h.runAll(10)
	})
	t.Run("a request waiting behind a running one is admitted when it finishes, without input", func(t *testing.T) {
		h := newHarness(t, 4, Config{}, nil)
		a := h.add("a", prompt(1, 8), 4) // 3 blocks by its last token
		b := h.add("b", prompt(2, 8), 2) // 2 blocks: waits for a
		h.runAll(20)
		for _, r := range []*Request{a, b} {
			if diff := cmp.Diff(want(r.Prompt, r.MaxTokens), r.Output()); diff != "" {
				t.Errorf("%s output (-want +got):\n%s", r.ID, diff)
			}
		}
	})
	t.Run("a connector not ready yet keeps the scheduler asking", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 4, Config{}, c)
		c.retry["r"] = 2
		r := h.add("r", prompt(1, 4), 1)
		for i := range 2 {
			h.step()
			if !h.s.HasWork() {
				t.Fatalf("HasWork() false after retry-later %d: the request would wait for an input that never comes", i+1)
			}
		}
		h.runAll(10)
		if len(r.Output()) != 1 {
			t.Errorf("r produced %d tokens, want 1", len(r.Output()))
		}
	})
}
