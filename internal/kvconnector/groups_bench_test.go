package kvconnector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// BenchmarkGemma3PDBytes measures the KV bytes a decode pulls for one P/D
// request of a Gemma 3 1B (26 layers, every sixth global, window 512, one
// KV head of 256, bf16 KV; its hidden and feed-forward sizes shrunk, which
// the KV does not depend on, so the prefill is quick) with the hybrid KV
// cache (sliding-window groups clipped to their window) and with
// --disable-hybrid-kv-cache-manager (every layer's block for every token),
// for prompts of 512 and 2048 tokens (longer prefills take many minutes on
// two cores; the bytes grow linearly from there, by one full-attention
// block and no sliding-window block per 16 tokens with hybrid groups).
//
//	go test -run '^$' -bench Gemma3PDBytes -benchtime 1x ./internal/kvconnector/
func BenchmarkGemma3PDBytes(b *testing.B) {
	st := loaded.Stories(b)
	spec, err := modelinit.Shape(modelinit.ShapeGemma31B, "bf16")
	if err != nil {
		b.Fatal(err)
	}
	spec.Hidden, spec.Intermediate, spec.Vocab, spec.BOS, spec.EOS = 64, 64, st.Tokenizer.VocabSize(), 1, 2
	dir := b.TempDir()
	if err := modelinit.Write(dir, spec, 3); err != nil {
		b.Fatal(err)
	}
	pool := tensor.NewPool(1)
	b.Cleanup(pool.Close)
	m, err := model.Load(dir, pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	start := func(role Role, disable bool) (*engine.Engine, *metrics.Engine) {
		met := metrics.NewEngine("gemma")
		c, err := NewConnector(ConnectorConfig{Role: role, EngineID: uuid.NewString(), ModelFingerprint: m.Fingerprint(),
			Host: "127.0.0.1", Metrics: met, Logger: discardLogger()})
		if err != nil {
			b.Fatal(err)
		}
		e, err := engine.New(engine.Config{Model: m, Tokenizer: st.Tokenizer, KVCacheMemory: 1 << 30, DisableHybridKVCache: disable,
			Connector: c, KVWorker: c, Metrics: met, Logger: discardLogger()})
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
		return e, met
	}
	submit := func(e *engine.Engine, prompt []int32, kv map[string]any) map[string]any {
		h, err := e.Submit(context.Background(), &engine.Request{Prompt: prompt, Params: greedy(1), KVTransfer: typed(b, kv)})
		if err != nil {
			b.Fatal(err)
		}
		var final engine.Event
		for ev := range h.Events {
			if ev.Finish != engine.FinishNone {
				final = ev
			}
		}
		if final.Err != nil {
			b.Fatalf("request ended %q: %v", final.Finish, final.Err)
		}
		if final.KVTransfer == nil {
			return nil
		}
		return wire(b, final.KVTransfer)
	}
	type pair struct {
		p, d *engine.Engine
		dm   *metrics.Engine
	}
	engines := map[string]pair{}
	for _, mode := range []string{"hybrid", "one-group"} {
		p, _ := start(RolePrefill, mode == "one-group")
		d, dm := start(RoleDecode, mode == "one-group")
		engines[mode] = pair{p, d, dm}
	}
	for _, n := range []int{512, 2048} {
		for _, mode := range []string{"hybrid", "one-group"} {
			p, d, dm := engines[mode].p, engines[mode].d, engines[mode].dm
			b.Run(fmt.Sprintf("prompt=%d/%s", n, mode), func(b *testing.B) {
				var bytes float64
				for i := range b.N {
					prompt := promptOf(uint64(n)<<8+uint64(i), n)
					kv := submit(p, prompt, prefillParams())
					before := value(b, dm.KVTransferBytes)
					submit(d, prompt, kv)
					bytes += value(b, dm.KVTransferBytes) - before
				}
				b.ReportMetric(bytes/float64(b.N), "pulled-B/req")
			})
		}
	}
}
