package kvconnector

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestPrefillDrainServesHeldKV drains a prefill engine that holds KV for a
// decode leg not sent yet: the drain outlives its request deadline (no
// request is left, but KV is held), the side channel keeps serving until
// the decode pulled, and the drain ends at the decode's DONE, not at the
// lease or the hold deadline; a hold nobody reads ends the drain at its
// lease's expiry. Each case runs in fake time (testing/synctest, the side
// channel in memory), so deadlines and leases pass exactly.
func TestPrefillDrainServesHeldKV(t *testing.T) {
	inBubble := func(name string, body func(t *testing.T, mem *testutil.MemNet)) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { body(t, testutil.NewMemNet()) })
		})
	}

	inBubble("held KV is pulled after the request deadline passed; the drain ends at the DONE", func(t *testing.T, mem *testutil.MemNet) {
		ref := newPD(t, pdOpts{})
		d := newPD(t, pdOpts{role: RoleDecode, net: mem})
		p := newPD(t, pdOpts{role: RolePrefill, lease: 20 * time.Second, net: mem, sweep: 100 * time.Millisecond})
		prompt := promptOf(901, 40)
		want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(8)})
		kv := prefill(t, p, prompt, greedy(8))
		reqCtx, cancelReq := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancelReq()
		holdCtx, cancelHold := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelHold()
		drained := make(chan error, 1)
		go func() { drained <- p.e.Drain(reqCtx, holdCtx) }()
		testutil.WaitFor(t, "the engine no longer ready", 5*time.Second, func() bool { return !p.e.Ready() })
		if _, err := p.e.Submit(t.Context(), &engine.Request{Prompt: prompt, Params: greedy(1), KVTransfer: typed(t, prefillParams())}); !errors.Is(err, engine.ErrShuttingDown) {
			t.Errorf("Submit to a draining engine: %v, want ErrShuttingDown", err)
		}
		<-reqCtx.Done() // past the request deadline: only the hold keeps the engine up
		time.Sleep(time.Second)
		synctest.Wait() // everything due in that second has run
		select {
		case err := <-drained:
			t.Fatalf("the drain ended (%v) while KV was held for a decode", err)
		default:
		}
		if n := p.c.HeldRequests(); n != 1 {
			t.Fatalf("%d requests held, want 1", n)
		}
		pulled := time.Now()
		got := decode(t, d, prompt, greedy(8), kv)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("decode after the prefill began draining differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
		}
		if err := <-drained; err != nil {
			t.Errorf("Drain: %v, want a clean drain", err)
		}
		if took := time.Since(pulled); took > time.Second {
			t.Errorf("the drain ended %v after the decode's pull, want at its DONE (the lease is 20 s)", took)
		}
		d.waitIdle(t)
	})

	inBubble("a hold nobody reads ends the drain at its lease's expiry", func(t *testing.T, mem *testutil.MemNet) {
		const lease, sweep = 3 * time.Second, 100 * time.Millisecond
		p := newPD(t, pdOpts{role: RolePrefill, lease: lease, net: mem, sweep: sweep})
		prefill(t, p, promptOf(902, 20), greedy(4))
		start := time.Now()
		holdCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.e.Drain(holdCtx, holdCtx); err != nil {
			t.Errorf("Drain: %v, want a clean drain (the lease expired)", err)
		}
		if took := time.Since(start); took < lease-sweep || took > lease+time.Second {
			t.Errorf("the drain took %v, want the %v lease (swept every %v)", took, lease, sweep)
		}
	})

	inBubble("the hold deadline gives up what is still held, and says so", func(t *testing.T, mem *testutil.MemNet) {
		d := newPD(t, pdOpts{role: RoleDecode, net: mem})
		p := newPD(t, pdOpts{role: RolePrefill, lease: 20 * time.Second, abandoned: true, net: mem})
		prompt := promptOf(903, 20)
		kv := prefill(t, p, prompt, greedy(4))
		reqCtx, cancelReq := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelReq()
		holdCtx, cancelHold := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancelHold()
		start := time.Now()
		err := p.e.Drain(reqCtx, holdCtx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Errorf("Drain: %v, want the hold deadline's error", err)
		}
		if took := time.Since(start); took < 200*time.Millisecond || took > time.Second {
			t.Errorf("the drain gave up after %v, want at the 200 ms hold deadline", took)
		}
		if got := decode(t, d, prompt, greedy(4), kv); got.final.Finish != engine.FinishError {
			t.Errorf("a pull after the drain gave up the hold: finish %q, want error", got.final.Finish)
		}
		d.waitIdle(t)
	})
}
