package kvconnector

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// BenchmarkTurn2TTFT measures the time to first token of a conversation's
// second turn through P/D on the smollm2-135m shape (bf16, random weights,
// 1 thread per engine): the turn-2 prefill leg plus the decode leg's first
// token, for histories of 512, 2048 and 8000 tokens and 64 new tokens,
// with multi-turn reuse (the prefill pulls the history from the decode) and
// without (it computes all of it). TANDEM_BENCH_MODEL names an existing
// model directory.
//
//	go test -run '^$' -bench Turn2TTFT -benchtime 3x ./internal/kvconnector/
func BenchmarkTurn2TTFT(b *testing.B) {
	dir := os.Getenv("TANDEM_BENCH_MODEL")
	if dir == "" {
		dir = b.TempDir()
		if _, err := modelinit.Init(dir, "smollm2-135m", "bf16", 1); err != nil {
			b.Fatal(err)
		}
	}
	start := func(role Role, bidir bool) *engine.Engine {
		pool := tensor.NewPool(1)
		b.Cleanup(pool.Close)
		m, err := model.Load(dir, pool)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		tok, err := tokenizer.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		c, err := NewConnector(ConnectorConfig{Role: role, EngineID: uuid.NewString(), ModelFingerprint: m.Fingerprint(),
			Host: "127.0.0.1", Bidirectional: bidir, Logger: discardLogger()})
		if err != nil {
			b.Fatal(err)
		}
		e, err := engine.New(engine.Config{Model: m, Tokenizer: tok, NumBlocks: 1200, MaxNumBatchedTokens: 2048,
			Connector: c, KVWorker: c, Logger: discardLogger()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e.Shutdown(ctx)
		})
		if err := c.Start(e); err != nil {
			b.Fatal(err)
		}
		return e
	}
	submit := func(e *engine.Engine, prompt []int32, n int, kv map[string]any) (time.Time, []int32, map[string]any) {
		h, err := e.Submit(context.Background(), &engine.Request{Prompt: prompt, Params: greedy(n), KVTransfer: typed(b, kv)})
		if err != nil {
			b.Fatal(err)
		}
		var first time.Time
		var out []int32
		var final engine.Event
		for ev := range h.Events {
			if len(ev.Tokens) > 0 && first.IsZero() {
				first = time.Now()
			}
			out = append(out, ev.Tokens...)
			if ev.Finish != engine.FinishNone {
				final = ev
			}
		}
		if final.Err != nil || final.KVTransfer == nil {
			b.Fatalf("request ended %q (%v) without kv_transfer_params", final.Finish, final.Err)
		}
		return first, out, wire(b, final.KVTransfer)
	}
	p1, d := start(RolePrefill, true), start(RoleDecode, true)
	for _, hist := range []int{512, 2048, 8000} { // 8000 + 64 new tokens fit the shape's 8192 positions
		for _, mode := range []string{"pull", "recompute"} {
			p2 := start(RolePrefill, mode == "pull")
			b.Run(fmt.Sprintf("history=%d/%s", hist, mode), func(b *testing.B) {
				var total time.Duration
				for i := range b.N {
					// Turn 1: a (hist-16)-token prompt and 17 output tokens,
					// so the decode holds hist tokens of KV.
					seed := uint64(hist)<<8 + uint64(i)
					prompt1 := promptOf(seed, hist-16)
					_, _, kv := submit(p1, prompt1, 1, prefillParams())
					_, out1, conv := submit(d, prompt1, 17, kv)
					// Turn 2: the history and 64 new tokens.
					prompt2 := concat(prompt1, out1, promptOf(seed+1<<32, 64))
					t0 := time.Now()
					_, _, kv2 := submit(p2, prompt2, 1, conv)
					first, _, _ := submit(d, prompt2, 1, kv2)
					total += first.Sub(t0)
				}
				b.ReportMetric(total.Seconds()*1e3/float64(b.N), "ms/ttft")
			})
		}
	}
}
