package engine

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sched"
)

// holdingConnector keeps the blocks of every request with kv params after it
// finishes, as a prefill's connector does until the remote decode has read
// them (released by finished_sending through Engine.ReportKV).
type holdingConnector struct{ sched.NoConnector }

func (holdingConnector) RequestFinished(r *sched.Request, blocks []int32) (bool, json.RawMessage) {
	return r.KVParams != nil, nil
}

// stepCounter counts the loop's steps from any goroutine.
type stepCounter struct{ n atomic.Int64 }

func (w *stepCounter) Step(sched.ConnectorMeta) (KVCompletions, error) {
	w.n.Add(1)
	return KVCompletions{}, nil
}

// TestBlockedWorkSleeps fills the pool with blocks held for a remote decode,
// queues a request that cannot be admitted, and checks that the loop sleeps
// instead of spinning, then wakes for whatever can unblock the request.
func TestBlockedWorkSleeps(t *testing.T) {
	_, _, g := load(t)
	// blocked returns an engine whose 8-block pool has 7 blocks held by a
	// finished request (returned by its internal id) and a waiting request
	// that needs 3.
	blocked := func(t *testing.T, ctx context.Context) (e *Engine, w *stepCounter, held string, h *Handle) {
		t.Helper()
		w = &stepCounter{}
		e, _ = newEngine(t, Config{NumBlocks: 8, Connector: holdingConnector{}, KVWorker: w})
		hp, err := e.Submit(context.Background(), &Request{Prompt: g.GreedyIDs[:100], Params: greedy(1), KVTransfer: &kvparams.Params{DoRemoteDecode: true}})
		if err != nil {
			t.Fatal(err)
		}
		if r := collect(t, hp); r.last.Finish != FinishLength {
			t.Fatalf("holding request finished %q", r.last.Finish)
		}
		held = hp.ID
		waitStats(t, e, "7 of 8 blocks held", func(st Stats) bool { return st.FreeBlocks == 1 && st.Running+st.Waiting == 0 })
		// Not a prefix of the held prompt, which would share its blocks.
		h, err = e.Submit(ctx, &Request{Prompt: g.GreedyIDs[60:100], Params: greedy(4)})
		if err != nil {
			t.Fatal(err)
		}
		waitStats(t, e, "the request queued", func(st Stats) bool { return st.Waiting == 1 })
		before := w.n.Load()
		time.Sleep(200 * time.Millisecond)
		if n := w.n.Load() - before; n > 3 {
			t.Fatalf("%d steps in 200ms with only blocked work: the loop spins", n)
		}
		if st := e.Stats(); st.Waiting != 1 || st.FreeBlocks != 1 {
			t.Fatalf("after the wait: %+v, want the request still waiting", st)
		}
		return e, w, held, h
	}

	t.Run("a KV release reported by the connector admits the waiting request", func(t *testing.T) {
		e, _, held, h := blocked(t, context.Background())
		e.ReportKV(KVCompletions{FinishedSending: []string{held}})
		if r := collect(t, h); len(r.tokens) != 4 || r.last.Finish != FinishLength {
			t.Errorf("%d tokens, finish %q; want 4 and length", len(r.tokens), r.last.Finish)
		}
	})
	t.Run("cancelling the waiting request ends it at once", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		e, _, held, h := blocked(t, ctx)
		cancel()
		if r := collect(t, h); r.last.Finish != FinishAbort {
			t.Errorf("finish %q, want abort", r.last.Finish)
		}
		e.ReportKV(KVCompletions{FinishedSending: []string{held}})
	})
	t.Run("a new request is looked at, then the loop sleeps again", func(t *testing.T) {
		e, w, held, h := blocked(t, context.Background())
		h2, err := e.Submit(context.Background(), &Request{Prompt: g.GreedyIDs[30:50], Params: greedy(2)})
		if err != nil {
			t.Fatal(err)
		}
		waitStats(t, e, "two requests queued", func(st Stats) bool { return st.Waiting == 2 })
		before := w.n.Load()
		time.Sleep(100 * time.Millisecond)
		if n := w.n.Load() - before; n > 3 {
			t.Fatalf("%d steps in 100ms with two blocked requests: the loop spins", n)
		}
		e.ReportKV(KVCompletions{FinishedSending: []string{held}})
		for _, h := range []*Handle{h, h2} {
			if r := collect(t, h); r.last.Finish != FinishLength {
				t.Errorf("%s: finish %q, want length", h.ID, r.last.Finish)
			}
		}
	})
}

// waitStats waits up to 10 s for the engine's published Stats to satisfy ok.
func waitStats(t *testing.T, e *Engine, what string, ok func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := e.Stats(); !ok(st); st = e.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("never %s: %+v", what, st)
		}
		time.Sleep(time.Millisecond)
	}
}
