package openai

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/metrics"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// realServer is a Server over a real engine, reachable on loopback TCP.
type realServer struct {
	eng *engine.Engine
	api *Server
	url string
}

// startStories starts an engine on the shared stories260K model and an API
// server for it that serves the model as name.
func startStories(t *testing.T, name string, opts ...func(*Config)) *realServer {
	t.Helper()
	s := loaded.Stories(t)
	return startEngine(t, s.Model, s.Tokenizer, s.Dir, name, opts...)
}

// startReal loads the model in dir, which it closes when the test ends, and
// starts an engine and an API server on it.
func startReal(t *testing.T, dir, name string, opts ...func(*Config)) *realServer {
	t.Helper()
	pool := tensor.NewPool(1)
	t.Cleanup(pool.Close)
	m, err := model.Load(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return startEngine(t, m, tok, dir, name, opts...)
}

// startEngine starts an engine on m and an API server for it. When the test
// ends it checks that every KV block is back in the pool, then shuts both
// down.
func startEngine(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer, dir, name string, opts ...func(*Config)) *realServer {
	t.Helper()
	met := metrics.NewEngine(name)
	eng, err := engine.New(engine.Config{
		Model: m, Tokenizer: tok, NumBlocks: 128, MaxNumSeqs: 8,
		KVDir: t.TempDir(), Metrics: met, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	gc := m.GenerationConfig()
	cfg := Config{
		Backend: eng, Tokenizer: tok, ChatTemplate: ChatTemplateOf(tok),
		ModelName: name, ModelRoot: dir, Metrics: met.Handler(), Version: "test",
		Defaults: Defaults{Temperature: gc.Temperature, TopP: gc.TopP, TopK: gc.TopK, MinP: gc.MinP, RepetitionPenalty: gc.RepetitionPenalty, MaxNewTokens: gc.MaxNewTokens},
		Logger:   slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	api, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api)
	t.Cleanup(func() {
		ts.Close()
		testutil.WaitFor(t, "every KV block back in the pool", 5*time.Second, func() bool {
			s := eng.Stats()
			return s.FreeBlocks == s.TotalBlocks && s.Running == 0 && s.Waiting == 0
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := eng.Shutdown(ctx); err != nil {
			t.Errorf("engine shutdown: %v", err)
		}
	})
	return &realServer{eng: eng, api: api, url: ts.URL}
}

func TestStories260KGoldenGreedyOverHTTP(t *testing.T) {
	st := loaded.Stories(t)
	g, tok := st.Golden, st.Tokenizer
	s := startStories(t, "stories260K")
	// The golden ids start with the prompt (BOS); the text is what follows.
	const n = 64
	ids, _ := json.Marshal(g.PromptIDs)
	want := tok.Decode(g.GreedyIDs[len(g.PromptIDs):len(g.PromptIDs)+n], true)
	if !strings.HasPrefix(g.GreedyText, want) {
		t.Fatalf("golden text does not start with the decoded golden ids %q", want)
	}
	resp, body := post(t, s.url+"/v1/completions", `{"model":"stories260K","prompt":`+string(ids)+`,"max_tokens":64,"temperature":0,"ignore_eos":true}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var r CompletionResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Choices[0].Text; got != want {
		t.Errorf("greedy text over HTTP:\n got %q\nwant %q", got, want)
	}
	if r.Usage.PromptTokens != len(g.PromptIDs) || r.Usage.CompletionTokens != n || *r.Choices[0].FinishReason != "length" {
		t.Errorf("usage %+v finish %q", *r.Usage, *r.Choices[0].FinishReason)
	}

	t.Run("the official client streams and returns the same text", func(t *testing.T) {
		prompt := make([]int64, len(g.PromptIDs))
		for i, id := range g.PromptIDs {
			prompt[i] = int64(id)
		}
		got := runClient(t, s.url, "stories260K", prompt, 16, false)
		want16 := tok.Decode(g.GreedyIDs[len(g.PromptIDs):len(g.PromptIDs)+16], true)
		if got.completion != want16 || got.completionStream != want16 {
			t.Errorf("client got %q and stream %q, want %q", got.completion, got.completionStream, want16)
		}
		if got.streamUsage.CompletionTokens != 16 {
			t.Errorf("stream usage %+v", got.streamUsage)
		}
	})

	t.Run("a text prompt is tokenized with BOS and continues greedily", func(t *testing.T) {
		resp, body := post(t, s.url+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0,"logprobs":2}`, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var r CompletionResponse
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		lp := r.Choices[0].Logprobs
		if lp == nil || len(lp.Tokens) != 8 || len(lp.TopLogprobs[0]) < 2 || strings.Join(lp.Tokens, "") != r.Choices[0].Text {
			t.Errorf("logprobs %+v for text %q", lp, r.Choices[0].Text)
		}
	})

	t.Run("tokenize and detokenize round-trip", func(t *testing.T) {
		_, body := post(t, s.url+"/tokenize", `{"prompt":"Once upon a time"}`, nil)
		var tr TokenizeResponse
		if err := json.Unmarshal(body, &tr); err != nil {
			t.Fatal(err)
		}
		if tr.Count != len(tr.Tokens) || tr.MaxModelLen != 512 || tr.Tokens[0] != 1 {
			t.Fatalf("tokenize: %s", body)
		}
		ids, _ := json.Marshal(tr.Tokens[1:])
		_, body = post(t, s.url+"/detokenize", `{"tokens":`+string(ids)+`}`, nil)
		var dr DetokenizeResponse
		if err := json.Unmarshal(body, &dr); err != nil {
			t.Fatal(err)
		}
		if dr.Prompt != "Once upon a time" {
			t.Errorf("detokenize: %q", dr.Prompt)
		}
	})

	t.Run("a client that disconnects mid-stream frees its blocks", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions",
			strings.NewReader(`{"model":"stories260K","prompt":[1],"max_tokens":500,"ignore_eos":true,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		if st := s.eng.Stats(); st.FreeBlocks == st.TotalBlocks && st.Running == 0 {
			// The request may not have been counted yet; the check that
			// matters is that the pool fills up again below.
			t.Logf("stats before disconnect: %+v", st)
		}
		cancel()
		resp.Body.Close()
		testutil.WaitFor(t, "the pool to be full again", 5*time.Second, func() bool {
			st := s.eng.Stats()
			return st.FreeBlocks == st.TotalBlocks && st.Running == 0
		})
	})

	t.Run("models, health, version and metrics", func(t *testing.T) {
		for _, c := range []struct{ path, want string }{
			{"/v1/models", `"id":"stories260K","object":"model"`},
			{"/v1/models", `"max_model_len":512`},
			{"/health", ""},
			{"/version", `{"version":"test"}`},
			{"/metrics", "vllm:generation_tokens_total"},
		} {
			resp, err := http.Get(s.url + c.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), c.want) {
				t.Errorf("GET %s: %d %s", c.path, resp.StatusCode, body)
			}
		}
	})
}

func TestTinyChatWithOfficialClient(t *testing.T) {
	dir := t.TempDir()
	if _, err := modelinit.Init(dir, modelinit.ShapeTiny, "bf16", 7); err != nil {
		t.Fatal(err)
	}
	s := startReal(t, dir, "tiny")
	r := runClient(t, s.url, "tiny", []int64{5, 6, 7}, 6, true)
	if r.chat != r.chatStream || r.chatFinish != r.chatStreamFinish {
		t.Errorf("chat %q (%s) and chat stream %q (%s) differ", r.chat, r.chatFinish, r.chatStream, r.chatStreamFinish)
	}
	if r.completion != r.completionStream {
		t.Errorf("completion %q and stream %q differ", r.completion, r.completionStream)
	}
	t.Run("tokenize renders messages with the chat template", func(t *testing.T) {
		_, body := post(t, s.url+"/tokenize", `{"messages":[{"role":"user","content":"hi"}],"return_token_strs":true}`, nil)
		var tr TokenizeResponse
		if err := json.Unmarshal(body, &tr); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(tr.TokenStrs, ""); !strings.Contains(got, "<|im_start|>assistant") {
			t.Errorf("rendered chat prompt %q has no assistant header", got)
		}
	})
}

func TestDrainTurnsHealthUnavailable(t *testing.T) {
	s := startStories(t, "stories260K")
	s.api.Drain()
	resp, err := http.Get(s.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("health while draining: %d, want 503", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", s.url+"/v1/completions", strings.NewReader(`{"model":"stories260K","prompt":[1]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkError(t, resp, 503, TypeUnavailable, "", "shutting down")
}
