package kvconnector

import (
	"context"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
)

// prefillWith runs a prefill leg with the given params (a decode's
// conversation hold for turn 2) and returns the params for the decode leg.
func prefillWith(t *testing.T, p *pdEngine, prompt []int32, params sample.Params, kv map[string]any) map[string]any {
	t.Helper()
	o := run(t, p.e, &engine.Request{Prompt: prompt, Params: params, KVTransfer: kv})
	if len(o.tokens) != 1 || o.final.KVTransfer == nil {
		t.Fatalf("turn-2 prefill leg: %d tokens, finish %q (%v), params %v", len(o.tokens), o.final.Finish, o.final.Err, o.final.KVTransfer)
	}
	return wire(t, o.final.KVTransfer)
}

// releaseConversations gives up every conversation hold of d, the way
// memory pressure would, so the test's pool checks see a full pool.
func releaseConversations(t *testing.T, d *pdEngine) {
	t.Helper()
	d.c.prod.Evict(1<<30, time.Now())
	if ids := releasedIDs(d.c.prod.TakeReleased()); len(ids) > 0 {
		d.e.ReportKV(engine.KVCompletions{FinishedSending: ids})
	}
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// turn1 runs a disaggregated turn and returns its output and the decode's
// conversation params.
func turn1(t *testing.T, p, d *pdEngine, prompt []int32, n int) ([]int32, map[string]any) {
	t.Helper()
	kv := prefill(t, p, prompt, greedy(n))
	o := decode(t, d, prompt, greedy(n), kv)
	if o.final.KVTransfer == nil {
		t.Fatalf("the decode leg returned no conversation params (finish %q, %v)", o.final.Finish, o.final.Err)
	}
	return o.tokens, wire(t, o.final.KVTransfer)
}

func TestMultiTurnPullsTheHistoryFromTheDecode(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, policy: sched.LoadFailureRecompute})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	t.Cleanup(func() { releaseConversations(t, d) })

	prompt1 := promptOf(901, 80)
	out1, conv := turn1(t, p1, d, prompt1, 40)
	held := len(prompt1) + len(out1) - 1 // the last sampled token has no KV yet
	t.Run("the decode returns params naming the conversation it holds", func(t *testing.T) {
		want := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_num_tokens": float64(held),
			"tp_size": 1.0, "dcp_size": 1.0, "pp_size": 1.0, "transfer_mode": "pull"}
		for k, v := range want {
			if conv[k] != v {
				t.Errorf("%s = %v, want %v", k, conv[k], v)
			}
		}
		if exp, _ := conv["remote_blocks_expiry_time"].(float64); exp < float64(time.Now().Add(400*time.Second).Unix()) {
			t.Errorf("remote_blocks_expiry_time %v is not ~480 s ahead", conv["remote_blocks_expiry_time"])
		}
		if h, _ := conv[historyParam].([]any); len(h) != (held+15)/16 {
			t.Errorf("%s has %d hashes, want %d", historyParam, len(h), (held+15)/16)
		}
		if d.c.prod.FixedHolds() != 1 {
			t.Errorf("the decode holds %d conversations, want 1", d.c.prod.FixedHolds())
		}
	})

	t.Run("turn 2 pulls the history, computes only the new tokens and matches a colocated engine", func(t *testing.T) {
		prompt2 := concat(prompt1, out1, promptOf(902, 30))
		want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(20)})
		pulled := value(t, p2.m.HistoryTokensPulled)
		ext := counter(t, p2.m, "external_kv_transfer")
		local := counter(t, p2.m, "local_compute")
		kv2 := prefillWith(t, p2, prompt2, greedy(20), conv)
		if got := value(t, p2.m.HistoryTokensPulled) - pulled; got != float64(held) {
			t.Errorf("the prefill pulled %v history tokens, want %d", got, held)
		}
		if got := counter(t, p2.m, "external_kv_transfer") - ext; got != float64(held) {
			t.Errorf("external_kv_transfer grew by %v, want %d", got, held)
		}
		if got := counter(t, p2.m, "local_compute") - local; got != float64(len(prompt2)-held) {
			t.Errorf("the prefill computed %v prompt tokens, want only the %d new ones", got, len(prompt2)-held)
		}
		got := decode(t, d, prompt2, greedy(20), kv2)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
		}
		// The prefill's DONE released turn 1's hold; turn 2 holds anew.
		if n := d.c.prod.FixedHolds(); n != 1 {
			t.Errorf("the decode holds %d conversations after turn 2, want 1 (turn 1's released by the prefill's DONE)", n)
		}
		p2.waitIdle(t)
	})
}

func TestMultiTurnRecomputesWhatItMustNotPull(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, policy: sched.LoadFailureRecompute})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	short := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, holdTTL: 3 * time.Second}) // within the 5 s margin
	t.Cleanup(func() { releaseConversations(t, d); releaseConversations(t, short) })

	check := func(t *testing.T, prompt2 []int32, conv map[string]any, dec *pdEngine) {
		t.Helper()
		want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(12)})
		kv2 := prefillWith(t, p2, prompt2, greedy(12), conv)
		got := decode(t, dec, prompt2, greedy(12), kv2)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
		}
		p2.waitIdle(t)
	}
	t.Run("a rewritten history pulls only the blocks before the edit", func(t *testing.T) {
		prompt1 := promptOf(911, 80)
		out1, conv := turn1(t, p1, d, prompt1, 40)
		edited := slices.Clone(out1)
		edited[20]++ // the client edits the answer at token 100 of the conversation
		pulled := value(t, p2.m.HistoryTokensPulled)
		check(t, concat(prompt1, edited, promptOf(912, 20)), conv, d)
		if got := value(t, p2.m.HistoryTokensPulled) - pulled; got != 96 {
			t.Errorf("pulled %v tokens of a history edited at token 100, want the 96 of the 6 blocks before it", got)
		}
	})
	t.Run("a history rewritten from its first block is computed, and counted", func(t *testing.T) {
		prompt1 := promptOf(913, 80)
		out1, conv := turn1(t, p1, d, prompt1, 40)
		edited := slices.Clone(prompt1)
		edited[3]++
		before := value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch"))
		pulled := value(t, p2.m.HistoryTokensPulled)
		check(t, concat(edited, out1, promptOf(914, 20)), conv, d)
		if value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch")) != before+1 {
			t.Error("tandem:kv_history_recomputed_total{reason=history_mismatch} did not grow")
		}
		if value(t, p2.m.HistoryTokensPulled) != pulled {
			t.Error("KV of a different history was pulled")
		}
	})
	t.Run("a history below the recompute threshold is computed", func(t *testing.T) {
		prompt1 := promptOf(921, 20)
		out1, conv := turn1(t, p1, d, prompt1, 10)
		before := value(t, p2.m.HistoryRecomputed.WithLabelValues("below_threshold"))
		check(t, concat(prompt1, out1, promptOf(922, 10)), conv, d)
		if value(t, p2.m.HistoryRecomputed.WithLabelValues("below_threshold")) != before+1 {
			t.Error("tandem:kv_history_recomputed_total{reason=below_threshold} did not grow")
		}
	})
	t.Run("a hold that ends within the safety margin is not pulled", func(t *testing.T) {
		prompt1 := promptOf(931, 80)
		out1, conv := turn1(t, p1, short, prompt1, 40)
		before := value(t, p2.m.KVTransferFailures.WithLabelValues("expired"))
		check(t, concat(prompt1, out1, promptOf(932, 10)), conv, short)
		if value(t, p2.m.KVTransferFailures.WithLabelValues("expired")) != before+1 {
			t.Error("tandem:kv_transfer_failures_total{reason=expired} did not grow")
		}
	})
	t.Run("a decode restarted between turns is recomputed", func(t *testing.T) {
		gone := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
		prompt1 := promptOf(941, 80)
		out1, conv := turn1(t, p1, gone, prompt1, 40)
		releaseConversations(t, gone)
		gone.waitIdle(t)
		gone.e.Shutdown(t.Context())
		check(t, concat(prompt1, out1, promptOf(942, 10)), conv, d)
	})
}

func TestConversationHoldsGiveWayToNewRequests(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, numBlocks: 40})
	t.Cleanup(func() { releaseConversations(t, d) })
	for i := range 4 {
		turn1(t, p, d, promptOf(uint64(951+i), 100), 20) // 8 blocks each
	}
	if n := d.c.prod.FixedHolds(); n != 4 {
		t.Fatalf("the decode holds %d conversations, want 4", n)
	}
	// 32 of 40 blocks are held; a request needing 20 must still run.
	o := run(t, d.e, &engine.Request{Prompt: promptOf(960, 300), Params: greedy(8)})
	if len(o.tokens) != 8 || o.final.Err != nil {
		t.Fatalf("a new request under memory pressure: %d tokens, %v", len(o.tokens), o.final.Err)
	}
	if n := d.c.prod.FixedHolds(); n >= 4 {
		t.Fatalf("no conversation hold was given up (%d left)", n)
	}
}

// TestShutdownGivesUpConversationHolds: a draining decode does not wait
// out its conversation holds (480 s): it will not serve their next turn.
func TestShutdownGivesUpConversationHolds(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	turn1(t, p, d, promptOf(971, 80), 20)
	if d.c.prod.FixedHolds() != 1 {
		t.Fatal("no conversation held")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := d.e.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("shutdown took %v with a conversation held", took)
	}
	if n := d.c.prod.FixedHolds(); n != 0 {
		t.Errorf("%d conversation holds left after shutdown", n)
	}
}
