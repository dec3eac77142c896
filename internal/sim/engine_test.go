package sim_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// prefillTime runs one n-token prompt (one output token) through a real
// engine over a simulated model with the built-in profile, at the given
// --max-num-batched-tokens, and returns the model's simulated time and
// steps. The model does not sleep: the simulated time is the time model's
// sum.
func prefillTime(t *testing.T, tok *tokenizer.Tokenizer, n, budget int) (time.Duration, int64) {
	t.Helper()
	m, err := sim.New(sim.Config{Vocab: tok.VocabSize(), MaxModelLen: 4096, Time: sim.DefaultProfile(), Sleep: func(time.Duration) {},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.New(engine.Config{Model: m, Tokenizer: tok, NumBlocks: 2 * n / 16, KVDir: t.TempDir(),
		MaxNumBatchedTokens: budget, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(10 + i%400)
	}
	h, err := e.Submit(context.Background(), &engine.Request{Prompt: prompt, Params: sample.Params{MaxTokens: 1, IgnoreEOS: true, Logprobs: -1}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-h.Events:
			if !ok {
				st := m.Stats()
				return st.SimulatedTime, st.Steps
			}
			if ev.Finish == engine.FinishError {
				t.Fatalf("the request failed: %v", ev.Err)
			}
		case <-deadline:
			t.Fatal("the request did not finish in 30 s")
		}
	}
}

// A simulated engine that prefills a prompt in chunks spends at least the
// time of one step over the whole prompt, as a real engine does: each
// chunk after the first also attends to the positions before it.
func TestChunkedPrefillCostsAtLeastTheOneShotPrefill(t *testing.T) {
	dir, err := defaultmodel.Install(filepath.Join(t.TempDir(), "model"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := sim.DefaultProfile()
	perStep := time.Duration(p.PrefillSeconds(0) * float64(time.Second))
	for _, n := range []int{1475, 2048} {
		oneShot, steps1 := prefillTime(t, tok, n, 2048)
		chunks, stepsC := prefillTime(t, tok, n, 512)
		t.Logf("%d tokens: one step %v, %d chunks of 512 %v", n, oneShot, stepsC, chunks)
		if steps1 != 1 || stepsC != int64((n+511)/512) {
			t.Fatalf("%d tokens: %d and %d steps, want 1 and %d", n, steps1, stepsC, (n+511)/512)
		}
		if chunks < oneShot {
			t.Errorf("%d tokens: chunks of 512 cost %v, less than one step (%v)", n, chunks, oneShot)
		}
		if limit := oneShot + time.Duration(stepsC-1)*perStep + time.Millisecond; chunks > limit {
			t.Errorf("%d tokens: chunks of 512 cost %v, more than one step plus the per-step cost of each extra step (%v)", n, chunks, limit)
		}
	}
}
