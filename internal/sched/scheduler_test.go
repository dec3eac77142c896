package sched

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestChunkedPrefill(t *testing.T) {
	h := newHarness(t, 16, Config{MaxNumBatchedTokens: 8}, nil)
	r := h.add("a", prompt(1, 20), 3)
	var got []string
	for h.s.HasWork() {
		got = append(got, ids(h.step().Scheduled)...)
	}
	wantSteps := []string{"a@0+8", "a@8+8", "a@16+4", "a@20+1", "a@21+1"}
	if diff := cmp.Diff(wantSteps, got); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want(r.Prompt, 3), r.Output()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if f := h.finished["a"]; f.Status != FinishedLength {
		t.Errorf("finish status %v, want FINISHED_LENGTH", f.Status)
	}
}

func TestBudget(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		steps  int
		expect [][]string
	}{
		{
			name:  "decodes go first and a new prompt fills the rest of the budget",
			cfg:   Config{MaxNumBatchedTokens: 6},
			steps: 4,
			expect: [][]string{
				{"a@0+3", "b@0+3"},
				{"a@3+1", "b@3+1", "c@0+4"},
				{"a@4+1", "b@4+1", "c@4+4"},
				{"a@5+1", "b@5+1", "c@8+2", "d@0+2"},
			},
		},
		{
			name:  "max num seqs caps the running set whatever the budget",
			cfg:   Config{MaxNumBatchedTokens: 100, MaxNumSeqs: 2},
			steps: 2,
			expect: [][]string{
				{"a@0+3", "b@0+3"},
				{"a@3+1", "b@3+1"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 32, tc.cfg, nil)
			a := h.add("a", prompt(1, 3), 10)
			b := h.add("b", prompt(2, 3), 10)
			var got [][]string
			got = append(got, ids(h.step().Scheduled))
			h.add("c", prompt(3, 10), 10)
			h.add("d", prompt(4, 10), 10)
			for range tc.steps - 1 {
				got = append(got, ids(h.step().Scheduled))
			}
			if diff := cmp.Diff(tc.expect, got); diff != "" {
				t.Errorf("schedule (-want +got):\n%s", diff)
			}
			h.runAll(200)
			if diff := cmp.Diff(want(a.Prompt, 10), a.Output()); diff != "" {
				t.Errorf("a output (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want(b.Prompt, 10), b.Output()); diff != "" {
				t.Errorf("b output (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPreemption(t *testing.T) {
	t.Run("the newest running request is preempted and resumes first with the same output", func(t *testing.T) {
		// 6 blocks of 4: a and b each start with 2 blocks (7 tokens), then
		// grow; c waits. When the pool runs out, c (newest) goes first,
		// then b.
		h := newHarness(t, 6, Config{}, nil)
		a := h.add("a", prompt(1, 7), 9)
		b := h.add("b", prompt(2, 7), 9)
		c := h.add("c", prompt(3, 3), 9)
		var order []string
		for n := 0; h.s.HasWork(); n++ {
			if n > 200 {
				t.Fatal("no progress")
			}
			out := h.step()
			for _, p := range out.Preempted {
				order = append(order, p.ID)
				if p.Status() != Preempted || h.s.waiting[0] != p {
					t.Errorf("preempted %s: status %v, front of queue %s", p.ID, p.Status(), h.s.waiting[0].ID)
				}
				if len(p.Blocks()) != 0 || p.NumComputedTokens() != 0 {
					t.Errorf("preempted %s still holds %d blocks, %d computed", p.ID, len(p.Blocks()), p.NumComputedTokens())
				}
			}
		}
		if len(order) == 0 || order[0] != "c" {
			t.Errorf("preemption order %v, want c first", order)
		}
		if st := h.s.Stats(); st.Preemptions != uint64(len(order)) {
			t.Errorf("Stats().Preemptions = %d, want %d", st.Preemptions, len(order))
		}
		for _, r := range []*Request{a, b, c} {
			if diff := cmp.Diff(want(r.Prompt, 9), r.Output()); diff != "" {
				t.Errorf("%s output after preemption (-want +got):\n%s", r.ID, diff)
			}
		}
	})
	t.Run("a preempted request already scheduled this step gives its budget back", func(t *testing.T) {
		// a decodes, b is a long running prefill; b's next chunk needs a
		// block held by nobody but the pool is full of a and b, so b (the
		// newest) preempts itself and a's decode stays scheduled.
		h := newHarness(t, 4, Config{MaxNumBatchedTokens: 4}, nil)
		a := h.add("a", prompt(1, 4), 8)
		h.step() // a prefilled
		b := h.add("b", prompt(2, 12), 2)
		for h.s.HasWork() {
			out := h.step()
			for _, sc := range out.Scheduled {
				if sc.Req.Status() == Preempted {
					t.Fatalf("preempted %s left in the schedule", sc.Req.ID)
				}
			}
		}
		if diff := cmp.Diff(want(a.Prompt, 8), a.Output()); diff != "" {
			t.Errorf("a (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want(b.Prompt, 2), b.Output()); diff != "" {
			t.Errorf("b (-want +got):\n%s", diff)
		}
	})
}

func TestTinyPool(t *testing.T) {
	t.Run("a request larger than the whole pool fails clearly instead of waiting forever", func(t *testing.T) {
		h := newHarness(t, 3, Config{}, nil)
		h.add("big", prompt(1, 10), 5) // 14 tokens of KV: 4 blocks
		ok := h.add("ok", prompt(2, 5), 7)
		h.runAll(100)
		f := h.finished["big"]
		if f.Status != FinishedError || !strings.Contains(f.Err, "whole pool has 3") {
			t.Errorf("big: %v %q, want FINISHED_ERROR naming the pool size", f.Status, f.Err)
		}
		if diff := cmp.Diff(want(ok.Prompt, 7), ok.Output()); diff != "" {
			t.Errorf("ok (-want +got):\n%s", diff)
		}
	})
	t.Run("many requests that each need the whole pool all finish", func(t *testing.T) {
		h := newHarness(t, 3, Config{MaxNumBatchedTokens: 5}, nil)
		var rs []*Request
		for i := range 8 {
			rs = append(rs, h.add(string(rune('a'+i)), prompt(i, 6), 7))
		}
		h.runAll(2000)
		for _, r := range rs {
			if diff := cmp.Diff(want(r.Prompt, 7), r.Output()); diff != "" {
				t.Errorf("%s (-want +got):\n%s", r.ID, diff)
			}
		}
	})
}

func TestStopFromEngine(t *testing.T) {
	h := newHarness(t, 16, Config{}, nil)
	r := h.add("a", prompt(1, 5), 50)
	h.stop = func(r *Request, tok int32) Status {
		if len(r.Output()) == 3 {
			return FinishedStopped
		}
		return 0
	}
	h.runAll(100)
	if len(r.Output()) != 4 || h.finished["a"].Status != FinishedStopped {
		t.Errorf("output %d tokens, status %v; want 4 and FINISHED_STOPPED", len(r.Output()), h.finished["a"].Status)
	}
}

func TestAbort(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *harness) // leaves request "x" in the state under test
		state Status
	}{
		{"a waiting request is aborted and never runs", func(h *harness) { h.add("x", prompt(1, 5), 4) }, Waiting},
		{"a running request is aborted and its blocks return", func(h *harness) {
			h.add("x", prompt(1, 5), 20)
			h.step()
			h.step()
		}, Running},
		{"a preempted request is aborted from the queue", func(h *harness) {
			h.add("a", prompt(1, 4), 40)
			h.add("x", prompt(2, 4), 40)
			for h.s.reqs["x"].Status() != Preempted {
				h.step()
			}
		}, Preempted},
		{"a request aborted while its KV loads keeps its blocks until the load ends", func(h *harness) {
			h.conn.offer["x"], h.conn.async["x"] = -1, true
			h.add("x", prompt(1, 9), 4)
			h.step()
		}, WaitingForRemoteKVs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 16, Config{}, newTestConnector())
			tc.setup(h)
			x := h.s.reqs["x"]
			if x.Status() != tc.state {
				t.Fatalf("setup left x %v, want %v", x.Status(), tc.state)
			}
			held := len(x.Blocks())
			if !h.s.Abort("x") {
				t.Fatal("Abort reported x unknown")
			}
			if h.s.Abort("x") {
				t.Error("a second Abort reported x live")
			}
			h.runAll(500)
			if f := h.finished["x"]; f.Status != FinishedAborted {
				t.Errorf("x finished %v, want FINISHED_ABORTED", f.Status)
			}
			if h.conn.finished["x"] != 1 {
				t.Errorf("RequestFinished called %d times, want 1", h.conn.finished["x"])
			}
			if tc.state == WaitingForRemoteKVs {
				if got := h.pool.NumBlocks() - h.pool.FreeBlocks(); got != held {
					t.Fatalf("%d blocks in use after abort, want x's %d kept for the in-flight load", got, held)
				}
				h.s.UpdateFromConnector([]string{"x"}, nil, nil)
			}
		})
	}
	t.Run("aborting an unknown request reports false", func(t *testing.T) {
		h := newHarness(t, 2, Config{}, nil)
		if h.s.Abort("nope") {
			t.Error("Abort(unknown) = true")
		}
	})
}

func TestPrefixCaching(t *testing.T) {
	t.Run("a repeated prompt reuses all but its last block and gives the same output", func(t *testing.T) {
		h := newHarness(t, 16, Config{}, nil)
		p := prompt(1, 16) // exactly 4 blocks
		a := h.add("a", p, 5)
		h.runAll(100)
		b := h.add("b", p, 5)
		out := h.step()
		if got := ids(out.Scheduled); !cmp.Equal(got, []string{"b@12+4"}) {
			t.Errorf("first step of b %v, want the last block recomputed only", got)
		}
		h.runAll(100)
		if b.NumCachedTokens() != 12 {
			t.Errorf("NumCachedTokens() = %d, want 12", b.NumCachedTokens())
		}
		if !cmp.Equal(a.Output(), b.Output()) {
			t.Errorf("outputs differ: %v vs %v", a.Output(), b.Output())
		}
		if q, hit := h.pool.PrefixStats(); q != 32 || hit != 12 {
			t.Errorf("prefix stats %d queried %d hit, want 32 and 12", q, hit)
		}
	})
	t.Run("a running request's blocks are shared with a new one", func(t *testing.T) {
		h := newHarness(t, 16, Config{}, nil)
		p := prompt(2, 10)
		h.add("a", p, 20)
		h.step()
		b := h.add("b", append(append([]int32{}, p[:8]...), 1, 2, 3), 3)
		h.step()
		if b.NumCachedTokens() != 8 {
			t.Fatalf("b hit %d tokens, want 8", b.NumCachedTokens())
		}
		if rc := h.pool.RefCount(b.Blocks()[0]); rc != 2 {
			t.Errorf("shared block ref count %d, want 2", rc)
		}
		h.runAll(100)
	})
	t.Run("output tokens are cached too, so a preempted request re-hits them", func(t *testing.T) {
		h := newHarness(t, 16, Config{}, nil)
		r := h.add("a", prompt(3, 4), 9) // after 8 outputs: 12 tokens computed = 3 blocks
		for len(r.Output()) < 9 {
			h.step()
		}
		if h.pool.NumCachedBlocks() != 3 {
			t.Errorf("%d cached blocks, want 3 (prompt and output blocks)", h.pool.NumCachedBlocks())
		}
	})
}

func TestAddValidation(t *testing.T) {
	h := newHarness(t, 4, Config{}, nil)
	tests := []struct {
		name string
		r    *Request
		want string
	}{
		{"an empty prompt is refused", &Request{ID: "e", MaxTokens: 1}, "empty prompt"},
		{"zero max tokens is refused", &Request{ID: "z", Prompt: []int32{1}}, "max tokens"},
		{"a nil request is refused", nil, "nil request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.s.Add(tc.r); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Add error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("a duplicate live id is refused", func(t *testing.T) {
		h.add("d", []int32{1}, 1)
		if err := h.s.Add(&Request{ID: "d", Prompt: []int32{1}, MaxTokens: 1}); err == nil {
			t.Error("duplicate id accepted")
		}
		h.runAll(10)
	})
	t.Run("a bad config is refused", func(t *testing.T) {
		if _, err := New(Config{LoadFailurePolicy: "retry"}, h.pool, nil); err == nil {
			t.Error("unknown policy accepted")
		}
		if _, err := New(Config{}, nil, nil); err == nil {
			t.Error("nil pool accepted")
		}
	})
}
