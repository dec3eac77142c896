package bench

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestRunAllAgainstARealEngine benchmarks a real engine (stories260K behind
// the OpenAI server, in process) and checks that every request completed
// with exactly the asked-for lengths and that the KV pool is full again.
func TestRunAllAgainstARealEngine(t *testing.T) {
	dir := testmodels.Stories260K(t)
	m, err := model.Load(dir, tensor.NewPool(1))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
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

	cfg := Config{
		URL: hs.URL, Concurrencies: []int{1, 4}, Requests: 8,
		PromptTokens: 24, MaxTokens: 16, Seed: 3, Timeout: 30 * time.Second,
	}
	reports, err := RunAll(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 2 {
		t.Fatalf("%d reports, want 2", len(reports))
	}
	for _, r := range reports {
		if r.Model != "stories260K" || r.Failed != 0 || r.Completed != cfg.Requests {
			t.Errorf("concurrency %d: model %q, completed %d, failed %d: %+v", r.Concurrency, r.Model, r.Completed, r.Failed, r.Errors)
		}
		if r.TotalOutputTokens != cfg.Requests*cfg.MaxTokens || r.TotalInputTokens != cfg.Requests*cfg.PromptTokens {
			t.Errorf("concurrency %d: %d prompt and %d output tokens, want %d and %d", r.Concurrency,
				r.TotalInputTokens, r.TotalOutputTokens, cfg.Requests*cfg.PromptTokens, cfg.Requests*cfg.MaxTokens)
		}
		if r.TTFT.N != cfg.Requests || r.TPOT.P50 <= 0 || r.OutputThroughput <= 0 {
			t.Errorf("concurrency %d: implausible latencies: TTFT %+v TPOT %+v", r.Concurrency, r.TTFT, r.TPOT)
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
