package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// TestSubmitDuringShutdown races Submit against Shutdown: every Submit must
// either be refused with ErrShuttingDown or deliver a final event and close
// its channel. A request slipped in after the loop stopped would never end
// (its forwarder goroutine and its id would leak). Run it with -race.
func TestSubmitDuringShutdown(t *testing.T) {
	m, tok, _ := load(t)
	iterations := 200
	if testing.Short() {
		iterations = 20
	}
	for i := range iterations {
		e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 16, KVDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		// Odd iterations shut down with no time left, so queued requests
		// are aborted rather than drained.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if i%2 == 1 {
			cancel()
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				for range 3 {
					h, err := e.Submit(context.Background(), &Request{Prompt: []int32{1}, Params: greedy(2)})
					if errors.Is(err, ErrShuttingDown) {
						continue
					}
					if err != nil {
						t.Errorf("iteration %d: Submit: %v", i, err)
						continue
					}
					if !finalEvent(h, 10*time.Second) {
						t.Errorf("iteration %d: request %s accepted but never ended", i, h.ID)
					}
				}
			})
		}
		wg.Go(func() {
			<-start
			if err := e.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("iteration %d: Shutdown: %v", i, err)
			}
		})
		close(start)
		wg.Wait()
		cancel()
		if t.Failed() {
			return
		}
	}
}

// finalEvent reads h's events until the channel closes and reports whether a
// final event came first, giving up after d.
func finalEvent(h *Handle, d time.Duration) bool {
	timeout := time.After(d)
	final := false
	for {
		select {
		case ev, ok := <-h.Events:
			if !ok {
				return final
			}
			final = final || ev.Finish != FinishNone
		case <-timeout:
			return false
		}
	}
}
