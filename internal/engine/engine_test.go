package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// load returns the shared stories260K model, its tokenizer and its golden
// greedy run (the model is read-only; each engine owns its own KV pool).
func load(t *testing.T) (*model.Model, *tokenizer.Tokenizer, testutil.Golden) {
	t.Helper()
	s := loaded.Stories(t)
	return s.Model, s.Tokenizer, s.Golden
}

// newEngine starts an engine whose pool must be full again, and whose loop
// must stop, when the test ends.
func newEngine(t *testing.T, cfg Config) (*Engine, *metrics.Engine) {
	t.Helper()
	m, tok, _ := load(t)
	cfg.Model, cfg.Tokenizer = m, tok
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewEngine("stories260K")
	}
	if cfg.NumBlocks == 0 {
		cfg.NumBlocks = 256
	}
	cfg.KVDir = t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		waitPoolFull(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return e, cfg.Metrics
}

func waitPoolFull(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.FreeBlocks == st.TotalBlocks && st.Running == 0 && st.Waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not full again: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type result struct {
	tokens []int32
	text   string
	last   Event
	events int
	// timings are the Timing of every event that had one (the first
	// token's only).
	timings []*Timing
}

func collect(t *testing.T, h *Handle) result {
	t.Helper()
	var r result
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-h.Events:
			if !ok {
				if r.last.Finish == FinishNone {
					t.Fatalf("request %s: events closed without a final event", h.ID)
				}
				return r
			}
			r.events++
			r.tokens = append(r.tokens, ev.Tokens...)
			r.text += ev.Text
			if ev.Timing != nil {
				r.timings = append(r.timings, ev.Timing)
			}
			if ev.Finish != FinishNone {
				r.last = ev
			}
		case <-timeout:
			t.Fatalf("request %s: no final event within a minute", h.ID)
		}
	}
}

func run(t *testing.T, e *Engine, req *Request) result {
	t.Helper()
	h, err := e.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, h)
}

func greedy(maxTokens int) sample.Params {
	return sample.Params{MaxTokens: maxTokens, IgnoreEOS: true, Logprobs: -1}
}

func TestGoldenGreedy(t *testing.T) {
	e, _ := newEngine(t, Config{MaxNumBatchedTokens: 32})
	_, _, g := load(t)
	n := len(g.GreedyIDs) - len(g.PromptIDs)
	r := run(t, e, &Request{ID: "golden", Prompt: g.PromptIDs, Params: greedy(n)})
	if diff := cmp.Diff(g.GreedyIDs[len(g.PromptIDs):], r.tokens); diff != "" {
		t.Errorf("greedy tokens through the engine (-golden +got):\n%s", diff)
	}
	if r.text != g.GreedyText {
		t.Errorf("streamed text differs from the golden:\n got %q\nwant %q", r.text, g.GreedyText)
	}
	if r.last.Finish != FinishLength || r.last.Usage != (Usage{PromptTokens: 1, CompletionTokens: n}) {
		t.Errorf("final event %+v", r.last)
	}
}

// workload returns n requests over slices of the golden text, half greedy
// and half seeded sampling.
func workload(g testutil.Golden, n int) []*Request {
	var reqs []*Request
	for i := range n {
		start := (i * 7) % 120
		p := append([]int32{1}, g.GreedyIDs[1+start:1+start+5+(i*11)%60]...)
		params := greedy(8 + i%24)
		if i%2 == 1 {
			params = sample.Params{Temperature: 0.9, TopP: 0.95, Seed: uint64(1000 + i), HasSeed: true, MaxTokens: 8 + i%24, Logprobs: 2}
		}
		reqs = append(reqs, &Request{ID: fmt.Sprintf("r%02d", i), Prompt: p, Params: params})
	}
	return reqs
}

func runConcurrently(t *testing.T, e *Engine, reqs []*Request) []result {
	t.Helper()
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		h, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { out[i] = collect(t, h) })
	}
	wg.Wait()
	return out
}

func TestBatchInvariance(t *testing.T) {
	_, _, g := load(t)
	reqs := workload(g, 32)
	alone, _ := newEngine(t, Config{})
	want := make([]result, len(reqs))
	for i, r := range reqs {
		want[i] = run(t, alone, r)
	}
	tests := []struct {
		name string
		cfg  Config
	}{
		{"32 concurrent requests give the outputs they give one at a time", Config{MaxNumBatchedTokens: 64}},
		{"a pool small enough to force preemption still gives the same outputs", Config{NumBlocks: 12, MaxNumBatchedTokens: 48}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, m := newEngine(t, tc.cfg)
			got := runConcurrently(t, e, reqs)
			for i := range reqs {
				if diff := cmp.Diff(want[i].tokens, got[i].tokens); diff != "" {
					t.Errorf("%s (-alone +batched):\n%s", reqs[i].ID, diff)
				}
				if got[i].text != want[i].text || got[i].last.Finish != FinishLength {
					t.Errorf("%s: text %q finish %q, alone %q", reqs[i].ID, got[i].text, got[i].last.Finish, want[i].text)
				}
			}
			if tc.cfg.NumBlocks > 0 && value(t, m.NumPreemptions) == 0 {
				t.Error("the tiny pool never preempted: the test does not test preemption")
			}
		})
	}
}

func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func TestPrefixCacheHit(t *testing.T) {
	e, m := newEngine(t, Config{})
	_, _, g := load(t)
	p := g.GreedyIDs[:100]
	first := run(t, e, &Request{ID: "a", Prompt: p, Params: greedy(20)})
	second := run(t, e, &Request{ID: "b", Prompt: p, Params: greedy(20)})
	if diff := cmp.Diff(first.tokens, second.tokens); diff != "" {
		t.Errorf("output with a prefix hit differs (-miss +hit):\n%s", diff)
	}
	if first.last.Usage.CachedTokens != 0 || second.last.Usage.CachedTokens != 96 {
		t.Errorf("cached tokens %d then %d, want 0 then 96", first.last.Usage.CachedTokens, second.last.Usage.CachedTokens)
	}
	if hits, q := value(t, m.PrefixCacheHits), value(t, m.PrefixCacheQueries); hits != 96 || q != 200 {
		t.Errorf("prefix cache hits %v of %v queried tokens, want 96 of 200", hits, q)
	}
	if got := value(t, m.PromptTokensBySrc.WithLabelValues("local_cache_hit")); got != 96 {
		t.Errorf("prompt_tokens_by_source{local_cache_hit} = %v, want 96", got)
	}
	if got := value(t, m.PromptTokensBySrc.WithLabelValues("local_compute")); got != 104 {
		t.Errorf("prompt_tokens_by_source{local_compute} = %v, want 104", got)
	}
}

func TestStops(t *testing.T) {
	_, tok, g := load(t)
	out := g.GreedyIDs[1:]
	stopTok := out[5]
	text := tok.Decode(out[:12], true)
	stopStr := strings.Fields(text)[2]
	tests := []struct {
		name       string
		params     sample.Params
		wantTokens int
		wantFinish FinishReason
		wantReason string
		check      func(t *testing.T, r result)
	}{
		{"max tokens ends the request by length", greedy(7), 7, FinishLength, "", nil},
		{"a stop token id ends the request and is reported", sample.Params{MaxTokens: 50, IgnoreEOS: true, StopTokenIDs: []int32{stopTok}, Logprobs: -1},
			6, FinishStop, fmt.Sprint(stopTok), nil},
		// Masking the stop token before min_tokens changes the greedy path,
		// so only the length is checked.
		{"min tokens holds a stop token back", sample.Params{MaxTokens: 50, IgnoreEOS: true, MinTokens: 10, StopTokenIDs: []int32{stopTok}, Logprobs: -1},
			-1, FinishStop, fmt.Sprint(stopTok), func(t *testing.T, r result) {
				if len(r.tokens) < 10 {
					t.Errorf("stopped after %d tokens, before min_tokens 10", len(r.tokens))
				}
			}},
		{"a stop string cuts the text before it", sample.Params{MaxTokens: 50, IgnoreEOS: true, Stop: []string{stopStr}, Logprobs: -1},
			-1, FinishStop, stopStr, func(t *testing.T, r result) {
				if strings.Contains(r.text, stopStr) || !strings.HasPrefix(text, r.text) {
					t.Errorf("text %q: want the golden text up to %q", r.text, stopStr)
				}
			}},
		{"logprobs come with every token", sample.Params{MaxTokens: 5, IgnoreEOS: true, Logprobs: 3}, 5, FinishLength, "", nil},
	}
	e, _ := newEngine(t, Config{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := e.Submit(context.Background(), &Request{Prompt: g.PromptIDs, Params: tc.params})
			if err != nil {
				t.Fatal(err)
			}
			var r result
			var lps int
			for ev := range h.Events {
				r.tokens = append(r.tokens, ev.Tokens...)
				r.text += ev.Text
				lps += len(ev.Logprobs)
				for _, lp := range ev.Logprobs {
					if len(lp.Top) != tc.params.Logprobs {
						t.Errorf("%d top logprobs, want %d", len(lp.Top), tc.params.Logprobs)
					}
				}
				if ev.Finish != FinishNone {
					r.last = ev
				}
			}
			if tc.wantTokens >= 0 && len(r.tokens) != tc.wantTokens {
				t.Errorf("%d tokens, want %d", len(r.tokens), tc.wantTokens)
			}
			if tc.params.Logprobs >= 0 && lps != len(r.tokens) {
				t.Errorf("%d logprobs for %d tokens", lps, len(r.tokens))
			}
			if r.last.Finish != tc.wantFinish || r.last.StopReason != tc.wantReason {
				t.Errorf("finish %q reason %q, want %q %q", r.last.Finish, r.last.StopReason, tc.wantFinish, tc.wantReason)
			}
			if diff := cmp.Diff(out[:len(r.tokens)], r.tokens); tc.params.MinTokens == 0 && diff != "" {
				t.Errorf("tokens are not the greedy ones (-golden +got):\n%s", diff)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	e, _ := newEngine(t, Config{MaxModelLen: 64})
	tests := []struct {
		name      string
		req       *Request
		wantParam string
	}{
		{"an empty prompt is refused", &Request{Params: greedy(4)}, "prompt"},
		{"a token outside the vocabulary is refused", &Request{Prompt: []int32{1, 512}, Params: greedy(4)}, "prompt"},
		{"a negative token is refused", &Request{Prompt: []int32{-1}, Params: greedy(4)}, "prompt"},
		{"prompt plus max tokens over the context is refused", &Request{Prompt: make([]int32, 40), Params: greedy(30)}, "max_tokens"},
		{"a prompt filling the context leaves no room for output", &Request{Prompt: make([]int32, 64)}, "prompt"},
		{"min tokens above max tokens is refused", &Request{Prompt: []int32{1}, Params: sample.Params{MaxTokens: 2, MinTokens: 3, Logprobs: -1}}, "min_tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Submit(context.Background(), tc.req)
			var ie *InvalidRequestError
			if !errors.As(err, &ie) || ie.Param != tc.wantParam {
				t.Fatalf("Submit error = %v, want an InvalidRequestError on %q", err, tc.wantParam)
			}
		})
	}
	t.Run("a duplicate in-flight id is refused", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		h, err := e.Submit(ctx, &Request{ID: "dup", Prompt: []int32{1}, Params: greedy(60)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Submit(ctx, &Request{ID: "dup", Prompt: []int32{1}, Params: greedy(2)}); err == nil {
			t.Error("duplicate id accepted")
		}
		cancel()
		for range h.Events {
		}
	})
}

func TestAbort(t *testing.T) {
	_, _, g := load(t)
	long := func() *Request { return &Request{Prompt: g.GreedyIDs[:50], Params: greedy(400)} }
	t.Run("cancelling the context aborts the request and frees its blocks", func(t *testing.T) {
		e, _ := newEngine(t, Config{})
		ctx, cancel := context.WithCancel(context.Background())
		h, err := e.Submit(ctx, long())
		if err != nil {
			t.Fatal(err)
		}
		<-h.Events
		cancel()
		for range h.Events { // closed promptly, final event or not
		}
		waitPoolFull(t, e)
	})
	t.Run("Abort ends a running request with an abort event", func(t *testing.T) {
		e, m := newEngine(t, Config{})
		h, err := e.Submit(context.Background(), long())
		if err != nil {
			t.Fatal(err)
		}
		<-h.Events
		e.Abort(h.ID)
		r := collect(t, h)
		if r.last.Finish != FinishAbort {
			t.Errorf("finish %q, want abort", r.last.Finish)
		}
		waitPoolFull(t, e)
		if got := value(t, m.RequestSuccess.WithLabelValues("abort")); got != 1 {
			t.Errorf("request_success{abort} = %v", got)
		}
	})
	t.Run("aborting unknown ids is harmless", func(t *testing.T) {
		e, _ := newEngine(t, Config{})
		e.Abort("nobody")
		run(t, e, &Request{Prompt: []int32{1}, Params: greedy(3)})
	})
}

func TestShutdown(t *testing.T) {
	_, _, g := load(t)
	t.Run("a graceful shutdown lets requests finish and then refuses new ones", func(t *testing.T) {
		m, tok, _ := load(t)
		e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 64, KVDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		h, err := e.Submit(context.Background(), &Request{Prompt: g.PromptIDs, Params: greedy(30)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := collect(t, h); len(r.tokens) != 30 || r.last.Finish != FinishLength {
			t.Errorf("drained request: %d tokens, finish %q", len(r.tokens), r.last.Finish)
		}
		if e.Ready() {
			t.Error("Ready() after Shutdown")
		}
		if _, err := e.Submit(context.Background(), &Request{Prompt: []int32{1}, Params: greedy(1)}); !errors.Is(err, ErrShuttingDown) {
			t.Errorf("Submit after Shutdown = %v, want ErrShuttingDown", err)
		}
	})
	t.Run("a shutdown out of time aborts what is left", func(t *testing.T) {
		m, tok, _ := load(t)
		e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 64, KVDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		h, err := e.Submit(context.Background(), &Request{Prompt: g.PromptIDs, Params: greedy(500)})
		if err != nil {
			t.Fatal(err)
		}
		<-h.Events
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := e.Shutdown(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Shutdown = %v, want context.Canceled", err)
		}
		if r := collect(t, h); r.last.Finish != FinishAbort {
			t.Errorf("finish %q, want abort", r.last.Finish)
		}
	})
}

func TestSpecialTokensInText(t *testing.T) {
	_, tok, g := load(t)
	e, _ := newEngine(t, Config{})
	eos := tok.EOS()[0]
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep special tokens %v", keep), func(t *testing.T) {
			// Force EOS as every token and keep going past it.
			p := greedy(3)
			p.IgnoreEOS = true
			p.KeepSpecialTokens = keep
			p.LogitBias = map[int32]float32{eos: 100}
			got := run(t, e, &Request{Prompt: g.PromptIDs, Params: p})
			want := ""
			if keep {
				want = strings.Repeat(tok.Decode([]int32{eos}, false), 3)
			}
			if got.text != want || len(got.tokens) != 3 {
				t.Errorf("text %q (%d tokens), want %q (3 tokens)", got.text, len(got.tokens), want)
			}
		})
	}
	waitPoolFull(t, e)
}
