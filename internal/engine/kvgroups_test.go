package engine

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// gemmaShaped writes and loads a small Gemma 3: six layers, five of them
// local with a window of 32 and one global, 4096 positions, the stories
// tokenizer's vocabulary.
func gemmaShaped(t *testing.T) *model.Model {
	t.Helper()
	_, tok, _ := load(t)
	dir := t.TempDir()
	spec := modelinit.Spec{
		ModelType: "gemma3_text", Hidden: 32, Layers: 6, Heads: 2, KVHeads: 1, HeadDim: 16,
		Intermediate: 48, Vocab: tok.VocabSize(), MaxPositions: 4096, RMSNormEps: 1e-6, RopeTheta: 1e6,
		BOS: 1, EOS: 2, DType: "f32", Std: 0.15, Tied: true, SlidingWindow: 32,
		Gemma: modelinit.Gemma{Pattern: 6, LocalRopeTheta: 10000, QueryScalar: 16},
	}
	if err := modelinit.Write(dir, spec, 11); err != nil {
		t.Fatal(err)
	}
	pool := tensor.NewPool(1)
	t.Cleanup(pool.Close)
	m, err := model.Load(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestHybridKVCacheHoldsAFraction checks that a Gemma-3-shaped model at a
// long context (1,500 prompt tokens, a window of 32) runs in a KV pool a
// third the size of the whole sequence's cache when its layers are grouped
// by attention type, answering the tokens the one-group layout answers
// with a big enough pool, while the one-group layout cannot take the
// request in the small pool.
func TestHybridKVCacheHoldsAFraction(t *testing.T) {
	m := gemmaShaped(t)
	_, tok, _ := load(t)
	r := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int32, 1500)
	for i := range prompt {
		prompt[i] = int32(3 + r.IntN(tok.VocabSize()-3))
	}
	const bs = 16
	full := m.KVLayoutOf(bs, kvlayout.F32).BlockBytes() * ((len(prompt) + 20 + bs - 1) / bs) // the one-group cache of the sequence
	start := func(memory int64, disable bool) *Engine {
		e, err := New(Config{Model: m, Tokenizer: tok, BlockSize: bs, KVCacheMemory: memory, MaxNumBatchedTokens: 128,
			KVDir: t.TempDir(), DisableHybridKVCache: disable, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			waitPoolFull(t, e)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		})
		return e
	}
	req := func() *Request { return &Request{ID: "long", Prompt: prompt, Params: greedy(20)} }

	ref := run(t, start(int64(full), true), req())
	if ref.last.Finish != FinishLength {
		t.Fatalf("one group, whole cache: finish %q (%s)", ref.last.Finish, ref.last.Err)
	}
	small := int64(full / 3)
	hybrid := start(small, false)
	if got := hybrid.KVPool().Layout().Layers; got != 1 {
		t.Fatalf("hybrid pool has %d layers a block, want 1 (six groups of one layer)", got)
	}
	got := run(t, hybrid, req())
	if got.last.Finish != FinishLength {
		t.Fatalf("hybrid, a third of the cache: finish %q (%s)", got.last.Finish, got.last.Err)
	}
	if diff := cmp.Diff(ref.tokens, got.tokens); diff != "" {
		t.Errorf("hybrid KV cache changed the output (-one group +hybrid):\n%s", diff)
	}
	if res := run(t, start(small, true), req()); res.last.Finish != FinishError {
		t.Errorf("one group, a third of the cache: finish %q, want error (the request cannot fit)", res.last.Finish)
	}
}

// groupSink is a KVEventSink that sees every KV-cache group.
type groupSink struct {
	mu      sync.Mutex
	windows []int
	stored  map[int]int // stores per group
}

func (s *groupSink) SetGroupWindows(w []int) { s.windows = w }
func (s *groupSink) BlockStored(hash, parent kvcache.BlockHash, tokens []int32) {
	s.GroupBlockStored(0, hash, parent, tokens)
}
func (s *groupSink) BlockRemoved(hash kvcache.BlockHash) {}
func (s *groupSink) GroupBlockStored(g int, hash, parent kvcache.BlockHash, tokens []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored[g]++
}
func (s *groupSink) GroupBlockRemoved(g int, hash kvcache.BlockHash) {}
func (s *groupSink) Flush()                                          {}

// TestHybridKVEventsSeeEveryGroup checks that a KV-event sink that can
// tell groups apart is told the groups' windows and sees each group's
// stores.
func TestHybridKVEventsSeeEveryGroup(t *testing.T) {
	m := gemmaShaped(t)
	_, tok, _ := load(t)
	sink := &groupSink{stored: map[int]int{}}
	e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 256, KVDir: t.TempDir(), KVEvents: sink,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(3 + i)
	}
	run(t, e, &Request{ID: "a", Prompt: prompt, Params: greedy(2)})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.windows) != 6 || sink.windows[1] != 32 {
		t.Errorf("sink told windows %v, want six groups, the sliding ones of 32", sink.windows)
	}
	for g := range 6 {
		if sink.stored[g] != 2 { // two full blocks of 16 in 40 tokens
			t.Errorf("group %d: %d blocks stored, want 2", g, sink.stored[g])
		}
	}
}
