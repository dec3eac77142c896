package kvconnector

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// prefillWith runs a prefill leg with the given params (a decode's
// conversation hold for turn 2) and returns the params for the decode leg.
func prefillWith(t *testing.T, p *pdEngine, prompt []int32, params sample.Params, kv map[string]any) map[string]any {
	t.Helper()
	o := run(t, p.e, &engine.Request{Prompt: prompt, Params: params, KVTransfer: typed(t, kv)})
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
		partial := value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch_partial"))
		check(t, concat(prompt1, edited, promptOf(912, 20)), conv, d)
		if got := value(t, p2.m.HistoryTokensPulled) - pulled; got != 96 {
			t.Errorf("pulled %v tokens of a history edited at token 100, want the 96 of the 6 blocks before it", got)
		}
		if got := value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch_partial")) - partial; got != 1 {
			t.Errorf("tandem:kv_history_recomputed_total{reason=history_mismatch_partial} grew by %v, want 1", got)
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
		recomputed := value(t, p2.m.HistoryRecomputed.WithLabelValues("expired"))
		pulled := value(t, p2.m.HistoryTokensPulled)
		check(t, concat(prompt1, out1, promptOf(932, 10)), conv, short)
		if value(t, p2.m.KVTransferFailures.WithLabelValues("expired")) != before+1 {
			t.Error("tandem:kv_transfer_failures_total{reason=expired} did not grow")
		}
		if value(t, p2.m.HistoryRecomputed.WithLabelValues("expired")) != recomputed+1 {
			t.Error("tandem:kv_history_recomputed_total{reason=expired} did not grow")
		}
		if value(t, p2.m.HistoryTokensPulled) != pulled {
			t.Error("a declined pull counted as pulled history tokens")
		}
	})
	t.Run("a decode restarted between turns is recomputed", func(t *testing.T) {
		gone := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
		prompt1 := promptOf(941, 80)
		out1, conv := turn1(t, p1, gone, prompt1, 40)
		releaseConversations(t, gone)
		gone.waitIdle(t)
		gone.e.Shutdown(t.Context())
		before := value(t, p2.m.HistoryRecomputed.WithLabelValues("io"))
		check(t, concat(prompt1, out1, promptOf(942, 10)), conv, d)
		if value(t, p2.m.HistoryRecomputed.WithLabelValues("io")) != before+1 {
			t.Error("tandem:kv_history_recomputed_total{reason=io} did not grow for a decode that is gone")
		}
	})
	t.Run("a decode restarted with the same engine id and port: the stale peer is dropped", func(t *testing.T) {
		port := testutil.FreePort(t)
		const id = "decode-restarted"
		old := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, engineID: id, port: port})
		prompt1 := promptOf(943, 80)
		out1, conv1 := turn1(t, p1, old, prompt1, 40)
		// Turn 2 pulls from the old process: the prefill now knows the
		// peer (its handshake Info, a pooled connection).
		prompt2 := concat(prompt1, out1, promptOf(944, 10))
		// A long answer: turn 3 must pull more than the recompute threshold
		// beyond what the prefill has cached of turn 2's prompt.
		kv2 := prefillWith(t, p2, prompt2, greedy(80), conv1)
		o2 := decode(t, old, prompt2, greedy(80), kv2)
		conv2 := wire(t, o2.final.KVTransfer)
		p2.waitIdle(t)
		releaseConversations(t, old)
		old.waitIdle(t)
		if err := old.e.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		restarted := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, engineID: id, port: port})
		t.Cleanup(func() { releaseConversations(t, restarted) })
		if g1, g2 := conv2["remote_registration_generation"], restarted.c.prod.Info().Generation; g1 == fmt.Sprint(g2) {
			t.Fatalf("the restarted decode has the old registration generation %v", g1)
		}

		// Turn 3 names turn 2's hold, gone with the old process.
		before := value(t, p2.m.HistoryRecomputed.WithLabelValues("peer_restarted"))
		pulled := value(t, p2.m.HistoryTokensPulled)
		prompt3 := concat(prompt2, o2.tokens, promptOf(945, 10))
		check(t, prompt3, conv2, restarted)
		if value(t, p2.m.HistoryRecomputed.WithLabelValues("peer_restarted")) != before+1 {
			t.Error("tandem:kv_history_recomputed_total{reason=peer_restarted} did not grow")
		}
		if value(t, p2.m.HistoryTokensPulled) != pulled {
			t.Error("history tokens pulled from a restarted decode")
		}

		// The stale state is gone: a conversation held by the new process
		// is pulled from it.
		prompt4 := promptOf(946, 80)
		out4, conv4 := turn1(t, p1, restarted, prompt4, 40)
		pulled = value(t, p2.m.HistoryTokensPulled)
		check(t, concat(prompt4, out4, promptOf(947, 10)), conv4, restarted)
		if got := value(t, p2.m.HistoryTokensPulled) - pulled; got != float64(len(prompt4)+len(out4)-1) {
			t.Errorf("pulled %v history tokens from the restarted decode, want %d", got, len(prompt4)+len(out4)-1)
		}
	})
}

// TestMultiTurnExpiryGate ports vLLM's test_turn2_deadline_gate and
// test_turn2_full_prefix_hit_with_expired_deadline_skips_gate: a pull is
// declined (counted as expired, then recomputed) exactly when the decode's
// deadline is known and within the 5 s margin or past; a full local hit
// pulls nothing, so no deadline matters.
func TestMultiTurnExpiryGate(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, policy: sched.LoadFailureRecompute})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	t.Cleanup(func() { releaseConversations(t, d) })

	// The test engines run without a KV secret, so params are not signed
	// and the expiry time can be edited like a clock skew would move it.
	tests := []struct {
		name     string
		expiry   any // remote_blocks_expiry_time; nil deletes it
		declined bool
	}{
		{"expired", float64(time.Now().Add(-time.Minute).Unix()), true},
		{"within the margin", float64(time.Now().Add(3 * time.Second).Unix()), true},
		{"far", float64(time.Now().Add(time.Hour).Unix()), false},
		{"missing", nil, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prompt1 := promptOf(uint64(1001+10*i), 80)
			out1, conv := turn1(t, p1, d, prompt1, 40)
			delete(conv, "remote_blocks_expiry_time")
			if tt.expiry != nil {
				conv["remote_blocks_expiry_time"] = tt.expiry
			}
			prompt2 := concat(prompt1, out1, promptOf(uint64(1002+10*i), 10))
			want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(12)})
			expired := value(t, p2.m.KVTransferFailures.WithLabelValues("expired"))
			pulled := value(t, p2.m.HistoryTokensPulled)
			kv2 := prefillWith(t, p2, prompt2, greedy(12), conv)
			got := decode(t, d, prompt2, greedy(12), kv2)
			if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
				t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
			}
			gotDeclined := value(t, p2.m.KVTransferFailures.WithLabelValues("expired")) > expired
			if gotDeclined != tt.declined {
				t.Errorf("pull declined as expired: %v, want %v", gotDeclined, tt.declined)
			}
			if pulledAny := value(t, p2.m.HistoryTokensPulled) > pulled; pulledAny == tt.declined {
				t.Errorf("history pulled: %v, want %v", pulledAny, !tt.declined)
			}
			p2.waitIdle(t)
			releaseConversations(t, d)
		})
	}

	t.Run("a full local hit skips the pull and the gate, even with an expired deadline", func(t *testing.T) {
		prompt1 := promptOf(1101, 80)
		out1, conv := turn1(t, p1, d, prompt1, 40) // the decode holds 119 tokens
		conv["remote_blocks_expiry_time"] = float64(time.Now().Add(-time.Hour).Unix())
		prompt2 := concat(prompt1, out1, promptOf(1102, 20))
		// The prefill's own cache gets 8 blocks (128 tokens) of the prompt.
		run(t, p2.e, &engine.Request{Prompt: prompt2[:130], Params: greedy(1)})
		want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(12)})
		expired := value(t, p2.m.KVTransferFailures.WithLabelValues("expired"))
		pulled := value(t, p2.m.HistoryTokensPulled)
		hits := value(t, p2.m.HistoryRecomputed.WithLabelValues("local_hit"))
		kv2 := prefillWith(t, p2, prompt2, greedy(12), conv)
		if got := value(t, p2.m.HistoryRecomputed.WithLabelValues("local_hit")) - hits; got != 1 {
			t.Errorf("tandem:kv_history_recomputed_total{reason=local_hit} grew by %v, want 1", got)
		}
		if value(t, p2.m.KVTransferFailures.WithLabelValues("expired")) != expired || value(t, p2.m.HistoryTokensPulled) != pulled {
			t.Error("a full local hit pulled, or was declined by the expiry gate")
		}
		// The prefill told the decode it needs nothing: the hold is freed.
		testutil.WaitFor(t, "the decode's conversation hold freed", 10*time.Second, func() bool { return d.c.prod.FixedHolds() == 0 })
		got := decode(t, d, prompt2, greedy(12), kv2)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
		}
		p2.waitIdle(t)
	})
}

// TestMultiTurnHistoryLongerThanThePrompt ports
// test_remote_blocks_exceed_prompt_tokens and
// test_p_node_pulls_partial_last_block_from_d: a prompt shorter than the
// held history pulls what of it the prompt has, in whole blocks (the chain
// cannot check part of a block); a prompt that has the whole history pulls
// exactly remote_num_tokens, its partial last block included. Neither is a
// rewritten history.
func TestMultiTurnHistoryLongerThanThePrompt(t *testing.T) {
	ref := newPD(t, pdOpts{})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	t.Cleanup(func() { releaseConversations(t, d) })
	tests := []struct {
		name       string
		seed       uint64
		promptLen  func(held int) int
		wantPulled func(held int) int
	}{
		{"a prompt ending inside the history", 1201, func(int) int { return 100 }, func(int) int { return 96 }},
		{"a prompt ending inside the history's last block", 1202, func(held int) int { return held - 2 }, func(held int) int { return (held - 2) / 16 * 16 }},
		{"a prompt that is the whole history and the last sampled token", 1203, func(held int) int { return held + 1 }, func(held int) int { return held }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prompt1 := promptOf(tt.seed, 80)
			out1, conv := turn1(t, p1, d, prompt1, 40)
			held := len(prompt1) + len(out1) - 1
			prompt2 := concat(prompt1, out1)[:tt.promptLen(held)]
			want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(12)})
			pulled := value(t, p2.m.HistoryTokensPulled)
			local := counter(t, p2.m, "local_compute")
			mismatch := value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch")) + value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch_partial"))
			kv2 := prefillWith(t, p2, prompt2, greedy(12), conv)
			if got, want := value(t, p2.m.HistoryTokensPulled)-pulled, tt.wantPulled(held); got != float64(want) {
				t.Errorf("pulled %v history tokens for a %d-token prompt of a %d-token history, want %d", got, len(prompt2), held, want)
			}
			if got, want := counter(t, p2.m, "local_compute")-local, len(prompt2)-tt.wantPulled(held); got != float64(want) {
				t.Errorf("computed %v prompt tokens, want %d", got, want)
			}
			if value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch"))+value(t, p2.m.HistoryRecomputed.WithLabelValues("history_mismatch_partial")) != mismatch {
				t.Error("a prompt shorter than the history counted as a rewritten history")
			}
			got := decode(t, d, prompt2, greedy(12), kv2)
			if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
				t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
			}
			p2.waitIdle(t)
			releaseConversations(t, d)
		})
	}
}

// TestMultiTurnDecodeAbortHoldsNothing: a decode leg the client abandons
// mid-stream (vLLM holds only LENGTH_CAPPED or STOPPED requests) frees its
// blocks and returns no params.
func TestMultiTurnDecodeAbortHoldsNothing(t *testing.T) {
	p := newPD(t, pdOpts{role: RolePrefill, bidirectional: true})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true})
	prompt := promptOf(1301, 60)
	kv := prefill(t, p, prompt, greedy(200))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h, err := d.e.Submit(ctx, &engine.Request{Prompt: prompt, Params: greedy(200), KVTransfer: typed(t, kv)})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var final engine.Event
	for ev := range h.Events {
		n += len(ev.Tokens)
		if n >= 3 {
			cancel() // the client disconnects after a few tokens
		}
		if ev.Finish != engine.FinishNone {
			final = ev
		}
	}
	if n >= 200 {
		t.Fatalf("the request was not aborted (%d tokens)", n)
	}
	if final.KVTransfer != nil {
		t.Errorf("an aborted decode leg returned params %v", final.KVTransfer)
	}
	if got := d.c.prod.FixedHolds(); got != 0 {
		t.Errorf("the decode holds %d conversations after an abort", got)
	}
	d.waitIdle(t)
	if v := value(t, d.m.ConversationHolds); v != 0 {
		t.Errorf("tandem:kv_conversation_holds = %v", v)
	}
}

// TestMultiTurnHoldExpiryFreesTheDecodesBlocks: a conversation nobody
// continues gives its blocks back when --kv-decode-hold-ttl ends
// (heartbeats do not extend it). In fake time (testing/synctest, the side
// channels in memory), so every sweep due by then has run before the test
// looks.
func TestMultiTurnHoldExpiryFreesTheDecodesBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := testutil.NewMemNet()
		p := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, net: mem, sweep: time.Second})
		d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, holdTTL: 480 * time.Second, net: mem, sweep: time.Second})
		prompt := promptOf(1401, 80)
		start := time.Now()
		out, conv := turn1(t, p, d, prompt, 40)
		end := time.Now()
		held := len(prompt) + len(out) - 1
		if got, want := d.usedBlocks(t), (held+15)/16; got != want {
			t.Fatalf("%d blocks in use on the decode, want the %d of the held conversation", got, want)
		}
		// The gauge follows holds on an idle engine too (no step runs).
		if v := value(t, d.m.ConversationHolds); v != 1 {
			t.Errorf("tandem:kv_conversation_holds = %v after turn 1, want 1", v)
		}
		ttl := 480 * time.Second
		if exp := conv["remote_blocks_expiry_time"].(float64); exp < unixSeconds(start.Add(ttl)) || exp > unixSeconds(end.Add(ttl)) {
			t.Errorf("remote_blocks_expiry_time %v, want the decode's clock + 480 s (%v to %v)", exp, unixSeconds(start.Add(ttl)), unixSeconds(end.Add(ttl)))
		}
		time.Sleep(479 * time.Second) // 479 sweeps
		synctest.Wait()
		if d.c.prod.FixedHolds() != 1 {
			t.Fatal("the hold ended before its TTL")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := d.c.prod.FixedHolds(); n != 0 {
			t.Fatalf("%d conversations held a second after their TTL", n)
		}
		d.waitIdle(t)
		if v := value(t, d.m.ConversationHolds); v != 0 {
			t.Errorf("tandem:kv_conversation_holds = %v after the hold expired", v)
		}
	})
}

// unixSeconds is t as remote_blocks_expiry_time spells it.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

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
