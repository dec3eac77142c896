package sched

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRemotePrefillLifecycle(t *testing.T) {
	t.Run("an async load waits unscheduled, then runs only the last token", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		p := prompt(1, 12) // exactly 3 blocks
		c.offer["r"], c.async["r"] = -1, true
		r := h.add("r", p, 3)
		for i := range 2 {
			out := h.step()
			if len(out.Scheduled) != 0 || r.Status() != WaitingForRemoteKVs {
				t.Fatalf("step %d: scheduled %v, status %v; want nothing and WAITING_FOR_REMOTE_KVS", i, ids(out.Scheduled), r.Status())
			}
		}
		if len(r.Blocks()) != 3 || h.pool.NumCachedBlocks() != 0 {
			t.Fatalf("%d blocks, %d cached while loading; want 3 and none", len(r.Blocks()), h.pool.NumCachedBlocks())
		}
		if diff := cmp.Diff([]string{"r:12"}, c.allocs); diff != "" {
			t.Errorf("UpdateStateAfterAlloc calls (-want +got):\n%s", diff)
		}
		if h.s.HasWork() {
			t.Error("HasWork() with only a loading request: the engine would spin")
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		if r.Status() != Waiting || r.NumComputedTokens() != 11 {
			t.Fatalf("after the load: %v with %d computed, want WAITING with 11", r.Status(), r.NumComputedTokens())
		}
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"r@11+1"}) {
			t.Errorf("first step after the load %v, want r@11+1", got)
		}
		if len(r.Blocks()) != 3 {
			t.Errorf("%d blocks after the first token, want no extra block", len(r.Blocks()))
		}
		h.runAll(20)
		if r.NumExternalTokens() != 12 || r.NumCachedTokens() != 0 {
			t.Errorf("external %d cached %d, want 12 and 0", r.NumExternalTokens(), r.NumCachedTokens())
		}
		if diff := cmp.Diff(want(p, 3), r.Output()); diff != "" {
			t.Errorf("output (-want +got):\n%s", diff)
		}
	})
	t.Run("blocks under load are never prefix hits for another request", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		p := prompt(2, 12)
		c.offer["r"], c.async["r"] = -1, true
		h.add("r", p, 2)
		h.step()
		local := h.add("l", p, 2)
		h.step()
		if local.NumCachedTokens() != 0 || c.localSeen["l"] != 0 {
			t.Errorf("l hit %d tokens of blocks still loading", local.NumCachedTokens())
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		h.runAll(50)
		late := h.add("late", p, 2)
		h.runAll(50)
		if late.NumCachedTokens() != 8 {
			t.Errorf("after the load a new request hit %d tokens, want 8", late.NumCachedTokens())
		}
	})
	t.Run("a load that cannot get blocks leaves the request waiting with none", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 4, Config{}, c)
		hog := h.add("hog", prompt(3, 12), 4) // 15 tokens: all 4 blocks
		c.offer["r"], c.async["r"] = -1, true
		r := h.add("r", prompt(4, 8), 2)
		h.step()
		if r.Status() != Waiting || len(r.Blocks()) != 0 {
			t.Fatalf("r %v with %d blocks, want WAITING with none", r.Status(), len(r.Blocks()))
		}
		for hog.Status() == Running {
			h.step()
		}
		h.step()
		if r.Status() != WaitingForRemoteKVs {
			t.Fatalf("r %v once memory freed, want WAITING_FOR_REMOTE_KVS", r.Status())
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		h.runAll(20)
	})
	t.Run("local requests run while a load is in flight", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		c.offer["r"], c.async["r"] = -1, true
		r := h.add("r", prompt(5, 6), 3)
		l := h.add("l", prompt(6, 6), 3)
		for len(l.Output()) < 3 {
			h.step()
		}
		if r.Status() != WaitingForRemoteKVs || len(r.Output()) != 0 {
			t.Fatalf("r %v with %d tokens, want still loading", r.Status(), len(r.Output()))
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		h.runAll(20)
		if diff := cmp.Diff(want(r.Prompt, 3), r.Output()); diff != "" {
			t.Errorf("r (-want +got):\n%s", diff)
		}
	})
	t.Run("a full local hit loads nothing and tells the connector so", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		p := prompt(7, 13)
		h.add("warm", p, 1)
		h.runAll(20)
		c.offer["r"], c.async["r"] = -1, true // "the rest", which is 1 token: async only if > 0
		c.offer["r"] = 0
		r := h.add("r", p, 2)
		h.step()
		if c.localSeen["r"] != 12 || r.Status() != Running {
			t.Errorf("local %d status %v, want 12 and RUNNING", c.localSeen["r"], r.Status())
		}
		if diff := cmp.Diff([]string{"warm:0", "r:0"}, c.allocs); diff != "" {
			t.Errorf("UpdateStateAfterAlloc calls (-want +got):\n%s", diff)
		}
		h.runAll(20)
	})
	t.Run("a connector that is not ready skips the request for a step", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		c.retry["r"] = 2
		r := h.add("r", prompt(8, 4), 1)
		h.add("other", prompt(9, 4), 1)
		out := h.step()
		if got := ids(out.Scheduled); !cmp.Equal(got, []string{"other@0+4"}) {
			t.Errorf("scheduled %v, want other only", got)
		}
		h.runAll(20)
		if len(r.Output()) != 1 {
			t.Errorf("r produced %d tokens after retries, want 1", len(r.Output()))
		}
	})
	t.Run("a connector error fails the request", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		c.fail["r"] = errors.New("bad kv_transfer_params")
		h.add("r", prompt(8, 4), 1)
		h.runAll(20)
		if f := h.finished["r"]; f.Status != FinishedError || !strings.Contains(f.Err, "bad kv_transfer_params") {
			t.Errorf("r %v %q", f.Status, f.Err)
		}
	})
	t.Run("a sync load is computed in the step it is admitted", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		c.offer["r"] = -1
		r := h.add("r", prompt(10, 10), 2)
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"r@9+1"}) {
			t.Errorf("scheduled %v, want the last token only", got)
		}
		h.runAll(20)
		if r.NumExternalTokens() != 9 {
			t.Errorf("external tokens %d, want 9", r.NumExternalTokens())
		}
	})
}

func TestRemoteDecodeLifecycle(t *testing.T) {
	t.Run("a delayed free keeps the blocks until finished sending, whatever aborts arrive", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		c.delayFree["p"] = true
		p := h.add("p", prompt(1, 9), 1)
		h.step()
		f, ok := h.finished["p"]
		if !ok || f.Status != FinishedLength {
			t.Fatalf("p not finished by length after one token: %+v", f)
		}
		if diff := cmp.Diff([]int32{0, 1, 2}, heldBlocks(t, f.KVTransfer)); diff != "" {
			t.Errorf("kv_transfer_params (-want +got):\n%s", diff)
		}
		if h.pool.FreeBlocks() != 13 || h.pool.RefCount(p.Blocks()[0]) != 1 {
			t.Fatalf("free %d, ref %d: want the 3 blocks held once", h.pool.FreeBlocks(), h.pool.RefCount(p.Blocks()[0]))
		}
		if st := h.s.Stats(); st.Running+st.Waiting != 0 || st.Held != 1 {
			t.Errorf("stats %+v, want only one held request", st)
		}
		if h.s.Abort("p") {
			t.Error("abort of a finished held request reported it live")
		}
		h.s.UpdateFromConnector(nil, []string{"unknown"}, nil)
		if h.pool.FreeBlocks() != 13 {
			t.Fatal("blocks freed by an abort or an unknown id")
		}
		h.s.UpdateFromConnector(nil, []string{"p"}, nil)
		if c.finished["p"] != 1 {
			t.Errorf("RequestFinished called %d times", c.finished["p"])
		}
	})
	t.Run("with a local prefix hit all prompt blocks are returned, the partial one too", func(t *testing.T) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{}, c)
		p := prompt(2, 10)
		h.add("warm", p, 1)
		h.runAll(10)
		c.delayFree["p"] = true
		r := h.add("p", p, 1)
		h.step()
		if r.NumCachedTokens() != 8 {
			t.Errorf("cached %d, want 8", r.NumCachedTokens())
		}
		if got := heldBlocks(t, h.finished["p"].KVTransfer); len(got) != 3 {
			t.Errorf("remote_block_ids %v, want 3 blocks", got)
		}
		h.s.UpdateFromConnector(nil, []string{"p"}, nil)
	})
}

func TestLoadFailure(t *testing.T) {
	setup := func(t *testing.T, policy LoadFailurePolicy) (*harness, *Request) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{LoadFailurePolicy: policy}, c)
		c.offer["r"], c.async["r"] = -1, true
		r := h.add("r", prompt(1, 14), 2) // 4 blocks, the last partial
		h.step()
		return h, r
	}
	t.Run("under fail an invalid block errors the request and is never cached", func(t *testing.T) {
		h, r := setup(t, LoadFailureFail)
		bad := r.Blocks()[2]
		h.s.UpdateFromConnector(nil, nil, []int32{bad})
		if r.Status() != WaitingForRemoteKVs {
			t.Fatalf("r %v before finished_recving, want still loading (blocks busy)", r.Status())
		}
		h.s.UpdateFromConnector([]string{"r"}, nil, nil)
		h.runAll(10)
		if f := h.finished["r"]; f.Status != FinishedError || !strings.Contains(f.Err, "KV load failed") {
			t.Errorf("r %v %q, want FINISHED_ERROR", f.Status, f.Err)
		}
		if h.pool.NumCachedBlocks() != 0 {
			t.Errorf("%d blocks cached from a failed load", h.pool.NumCachedBlocks())
		}
		again := h.add("again", r.Prompt, 2)
		h.runAll(10)
		if again.NumCachedTokens() != 0 {
			t.Errorf("a later request hit %d tokens of a failed load", again.NumCachedTokens())
		}
	})
	t.Run("under recompute the valid prefix is kept and cached and the rest computed", func(t *testing.T) {
		h, r := setup(t, LoadFailureRecompute)
		h.s.UpdateFromConnector(nil, nil, []int32{r.Blocks()[3]})
		h.s.UpdateFromConnector([]string{"r"}, nil, []int32{r.Blocks()[2]}) // a later report moves truncation earlier
		if r.NumComputedTokens() != 8 || r.NumExternalTokens() != 8 {
			t.Fatalf("computed %d external %d, want 8 and 8", r.NumComputedTokens(), r.NumExternalTokens())
		}
		if h.pool.NumCachedBlocks() != 2 {
			t.Errorf("%d cached blocks, want the 2 valid ones", h.pool.NumCachedBlocks())
		}
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"r@8+6"}) {
			t.Errorf("scheduled %v, want the rest from the first invalid block", got)
		}
		h.runAll(10)
		if diff := cmp.Diff(want(r.Prompt, 2), r.Output()); diff != "" {
			t.Errorf("output (-want +got):\n%s", diff)
		}
	})
	syncSetup := func(t *testing.T, policy LoadFailurePolicy) (*harness, *Request, *Output) {
		c := newTestConnector()
		h := newHarness(t, 16, Config{LoadFailurePolicy: policy}, c)
		c.offer["r"] = -1
		r := h.add("r", prompt(2, 14), 2)
		out := h.s.Schedule()
		h.s.UpdateFromConnector(nil, nil, []int32{r.Blocks()[1]})
		return h, r, out
	}
	t.Run("a failed sync load under fail errors the running request", func(t *testing.T) {
		h, r, out := syncSetup(t, LoadFailureFail)
		h.record(h.s.Update(out, []Result{{ID: "r", Token: 5}}))
		h.runAll(10)
		if f := h.finished["r"]; f.Status != FinishedError || len(r.Output()) != 0 {
			t.Errorf("r %v with %d tokens, want FINISHED_ERROR and no token", f.Status, len(r.Output()))
		}
	})
	t.Run("a failed sync load under recompute discards the step and recomputes", func(t *testing.T) {
		h, r, out := syncSetup(t, LoadFailureRecompute)
		h.record(h.s.Update(out, []Result{{ID: "r", Token: 5}}))
		if r.Status() != Running || r.NumComputedTokens() != 4 || len(r.Output()) != 0 {
			t.Fatalf("r %v computed %d output %d, want RUNNING, 4, 0", r.Status(), r.NumComputedTokens(), len(r.Output()))
		}
		if got := ids(h.step().Scheduled); !cmp.Equal(got, []string{"r@4+10"}) {
			t.Errorf("scheduled %v, want the prompt from block 1", got)
		}
		h.runAll(10)
		if diff := cmp.Diff(want(r.Prompt, 2), r.Output()); diff != "" {
			t.Errorf("output (-want +got):\n%s", diff)
		}
	})
}

func TestConnectorCalls(t *testing.T) {
	c := newTestConnector()
	h := newHarness(t, 8, Config{}, c)
	h.add("a", prompt(1, 5), 2)
	h.add("b", prompt(2, 5), 2)
	h.s.Abort("b")
	n := h.runAll(20)
	if diff := cmp.Diff([]string{"a", "b"}, c.added); diff != "" {
		t.Errorf("OnNewRequest (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"a": 1, "b": 1}, c.finished); diff != "" {
		t.Errorf("RequestFinished calls (-want +got):\n%s", diff)
	}
	if c.metaCalls != n {
		t.Errorf("BuildConnectorMeta called %d times in %d steps", c.metaCalls, n)
	}
}
