package kvconnector

import (
	"context"
	"errors"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
)

// TestPrefillDrainServesHeldKV drains a prefill engine that holds KV for a
// decode leg not sent yet: the drain outlives its request deadline (no
// request is left, but KV is held), the side channel keeps serving until
// the decode pulled, and the drain ends at the decode's DONE, not at the
// lease or the hold deadline; a hold nobody reads ends the drain at its
// lease's expiry.
func TestPrefillDrainServesHeldKV(t *testing.T) {
	ref := newPD(t, pdOpts{})
	d := newPD(t, pdOpts{role: RoleDecode, transport: kvxfer.TransportTCP})

	t.Run("held KV is pulled after the request deadline passed; the drain ends at the DONE", func(t *testing.T) {
		p := newPD(t, pdOpts{role: RolePrefill, lease: 20 * time.Second})
		prompt := promptOf(901, 40)
		want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(8)})
		kv := prefill(t, p, prompt, greedy(8))
		reqCtx, cancelReq := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancelReq()
		holdCtx, cancelHold := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelHold()
		drained := make(chan error, 1)
		go func() { drained <- p.e.Drain(reqCtx, holdCtx) }()
		deadline := time.Now().Add(5 * time.Second)
		for p.e.Ready() {
			if time.Now().After(deadline) {
				t.Fatal("the engine is still ready 5s into its drain")
			}
			time.Sleep(time.Millisecond)
		}
		if _, err := p.e.Submit(t.Context(), &engine.Request{Prompt: prompt, Params: greedy(1), KVTransfer: typed(t, prefillParams())}); !errors.Is(err, engine.ErrShuttingDown) {
			t.Errorf("Submit to a draining engine: %v, want ErrShuttingDown", err)
		}
		<-reqCtx.Done() // past the request deadline: only the hold keeps the engine up
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-drained:
			t.Fatalf("the drain ended (%v) while KV was held for a decode", err)
		default:
		}
		if n := p.c.HeldRequests(); n != 1 {
			t.Fatalf("%d requests held, want 1", n)
		}
		got := decode(t, d, prompt, greedy(8), kv)
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("decode after the prefill began draining differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
		}
		select {
		case err := <-drained:
			if err != nil {
				t.Errorf("Drain: %v, want a clean drain", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the drain did not end within 5s of the decode's pull (lease 20s)")
		}
		d.waitIdle(t)
	})

	t.Run("a hold nobody reads ends the drain at its lease's expiry", func(t *testing.T) {
		const lease = 300 * time.Millisecond
		p := newPD(t, pdOpts{role: RolePrefill, lease: lease})
		prefill(t, p, promptOf(902, 20), greedy(4))
		start := time.Now()
		holdCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.e.Drain(holdCtx, holdCtx); err != nil {
			t.Errorf("Drain: %v, want a clean drain (the lease expired)", err)
		}
		if took := time.Since(start); took > lease+3*time.Second {
			t.Errorf("the drain took %v, want about the %v lease", took, lease)
		}
	})

	t.Run("the hold deadline gives up what is still held, and says so", func(t *testing.T) {
		p := newPD(t, pdOpts{role: RolePrefill, lease: 20 * time.Second, abandoned: true})
		prompt := promptOf(903, 20)
		kv := prefill(t, p, prompt, greedy(4))
		reqCtx, cancelReq := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelReq()
		holdCtx, cancelHold := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancelHold()
		err := p.e.Drain(reqCtx, holdCtx)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Errorf("Drain: %v, want the hold deadline's error", err)
		}
		if got := decode(t, d, prompt, greedy(4), kv); got.final.Finish != engine.FinishError {
			t.Errorf("a pull after the drain gave up the hold: finish %q, want error", got.final.Finish)
		}
		d.waitIdle(t)
	})
}
