package bench

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// TestRunAgainstARealEngine benchmarks a real engine (stories260K behind
// the OpenAI server, in process), its prompt ids from the server's
// /tokenize and relabelled per level, and checks that every request
// completed with exactly the asked-for lengths and that the KV pool is full
// again.
func TestRunAgainstARealEngine(t *testing.T) {
	st := loaded.Stories(t)
	m, tok := st.Model, st.Tokenizer
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(engine.Config{Model: m, Tokenizer: tok, NumBlocks: 128, KVDir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("engine Shutdown: %v", err)
		}
	}()
	srv, err := openai.NewServer(openai.Config{Backend: e, Tokenizer: tok, ModelName: "stories260K", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()

	c := NewClient(hs.URL, 1)
	pool, err := TokenPool(context.Background(), c, "stories260K", 0)
	if err != nil {
		t.Fatal(err)
	}
	const requests, prompt, out = 8, 24, 16
	p := &Plan{
		Targets: []Target{{"engine", hs.URL}}, Model: "stories260K", Loads: []Load{{Concurrency: 1}, {Concurrency: 4}},
		Workload: workload.Lengths("fixed", 3, requests, workload.Fixed(prompt), workload.Fixed(out), pool), Pool: pool,
		Seed: 3, Timeout: 30 * time.Second,
	}
	s, err := Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Results) != 2 {
		t.Fatalf("%d results, want 2", len(s.Results))
	}
	for _, r := range s.Results {
		if r.Failed != 0 || r.Completed != requests {
			t.Errorf("%s: completed %d, failed %d: %+v", r.Load, r.Completed, r.Failed, r.Errors)
		}
		if r.TotalOutputTokens != requests*out || r.TotalInputTokens != requests*prompt {
			t.Errorf("%s: %d prompt and %d output tokens, want %d and %d", r.Load,
				r.TotalInputTokens, r.TotalOutputTokens, requests*prompt, requests*out)
		}
		if r.TTFT.N != requests || r.TPOT.P50 <= 0 || r.OutputThroughput <= 0 {
			t.Errorf("%s: implausible latencies: TTFT %+v TPOT %+v", r.Load, r.TTFT, r.TPOT)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := e.Stats(); st.FreeBlocks != st.TotalBlocks; st = e.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("KV pool not full after the benchmark: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
