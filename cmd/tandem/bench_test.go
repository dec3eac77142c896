package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// completionsOnly is an OpenAI-compatible server with nothing but streaming
// /v1/completions, like vLLM's toy P/D proxy or a gateway: /v1/models and
// /tokenize are 404. It records the model names and prompts it was sent.
type completionsOnly struct {
	mu      sync.Mutex
	models  map[string]int
	prompts [][]int32
	other   []string
}

func (f *completionsOnly) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string  `json:"model"`
		Prompt    []int32 `json:"prompt"`
		MaxTokens int     `json:"max_tokens"`
	}
	if r.URL.Path != "/v1/completions" {
		f.mu.Lock()
		f.other = append(f.other, r.URL.Path)
		f.mu.Unlock()
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.models[req.Model]++
	f.prompts = append(f.prompts, req.Prompt)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range req.MaxTokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"Lily %d \"}]}\n\n", i)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", len(req.Prompt), req.MaxTokens)
}

func newCompletionsOnly(t *testing.T) (*completionsOnly, string) {
	f := &completionsOnly{models: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// TestBenchAgainstATargetWithoutModelsOrTokenize: `tandem bench` must work
// against a server that has neither /v1/models nor /tokenize (the tandem
// proxy has no /tokenize): with --model DIR its tokenizer makes the prompt
// ids and the model is named by the directory's base name; with a bare
// --model name the ids come from the stated default pool, with a warning;
// without --model it says to give one.
func TestBenchAgainstATargetWithoutModelsOrTokenize(t *testing.T) {
	dir := testmodels.Stories260K(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	textPool, err := bench.TextPool(tok.Encode(bench.SampleText, false))
	if err != nil {
		t.Fatal(err)
	}
	plan := func(url, model string) *bench.Plan {
		return &bench.Plan{Targets: []bench.Target{{Name: "a", URL: url}, {Name: "b", URL: url}}, Model: model}
	}
	flags := func() *workloadFlags {
		return &workloadFlags{kind: "fixed", requests: 2, promptTokens: 8, maxTokens: 2, given: map[string]bool{}}
	}

	t.Run("a model directory's tokenizer makes the ids", func(t *testing.T) {
		f, url := newCompletionsOnly(t)
		p := plan(url, dir)
		var log strings.Builder
		if err := prepare(context.Background(), p, flags(), &log); err != nil {
			t.Fatal(err)
		}
		if p.Model != filepath.Base(dir) || !slices.Equal(p.Pool, textPool) || !strings.Contains(log.String(), "as the tokenizer of "+dir) {
			t.Errorf("model %q, pool of %d ids (want %d), log %q", p.Model, len(p.Pool), len(textPool), log.String())
		}
		if p.Tokenize == nil {
			t.Fatal("no tokenizer for multi-turn answers")
		}
		if ids, err := p.Tokenize(context.Background(), p.Targets[0], "Lily"); err != nil || !slices.Equal(ids, tok.Encode("Lily", false)) {
			t.Errorf("answer tokens %v, %v", ids, err)
		}
		if !slices.Contains(f.other, "/v1/models") || !slices.Contains(f.other, "/tokenize") {
			t.Errorf("paths tried %v, want /v1/models and /tokenize tried first", f.other)
		}
	})
	t.Run("a bare name falls back to the default pool with a warning", func(t *testing.T) {
		_, url := newCompletionsOnly(t)
		p := plan(url, "smol")
		var log strings.Builder
		if err := prepare(context.Background(), p, flags(), &log); err != nil {
			t.Fatal(err)
		}
		if p.Model != "smol" || !slices.Equal(p.Pool, bench.DefaultPool()) || p.Tokenize != nil || !strings.Contains(log.String(), "warning: no target serves /tokenize") {
			t.Errorf("model %q, pool %v, log %q", p.Model, p.Pool, log.String())
		}
	})
	t.Run("--tokenizer DIR with a bare name", func(t *testing.T) {
		_, url := newCompletionsOnly(t)
		p := plan(url, "smol")
		wf := flags()
		wf.tokenizer = dir
		if err := prepare(context.Background(), p, wf, &strings.Builder{}); err != nil {
			t.Fatal(err)
		}
		if p.Model != "smol" || !slices.Equal(p.Pool, textPool) {
			t.Errorf("model %q, pool of %d ids", p.Model, len(p.Pool))
		}
	})
	t.Run("no model name and no /v1/models", func(t *testing.T) {
		_, url := newCompletionsOnly(t)
		err := prepare(context.Background(), plan(url, ""), flags(), &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), "give --model") {
			t.Errorf("err = %v, want a hint to give --model", err)
		}
	})
	t.Run("the README's command shape runs end to end", func(t *testing.T) {
		f, url := newCompletionsOnly(t)
		out := filepath.Join(t.TempDir(), "out.json")
		err := runBench([]string{"--target", "pd=" + url, "--target", "colocated=" + url, "--model", dir, "--workload", "multiturn",
			"--turns", "2", "--think", "1", "--requests", "3", "--rates", "50,100", "--slo-ttft", "1s", "--slo-tpot", "100ms",
			"--progress", "0", "--json", out})
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Results []struct {
				Completed int `json:"completed"`
				Failed    int `json:"failed"`
			} `json:"results"`
			Capacity []bench.Capacity `json:"capacity"`
		}
		readJSON(t, out, &s)
		if len(s.Results) != 4 || len(s.Capacity) != 2 || s.Capacity[0].Bound != "at least" {
			t.Fatalf("results %+v, capacity %+v", s.Results, s.Capacity)
		}
		for _, r := range s.Results {
			if r.Completed != 6 || r.Failed != 0 {
				t.Errorf("completed %d failed %d, want 3 conversations × 2 turns", r.Completed, r.Failed)
			}
		}
		if f.models[filepath.Base(dir)] != 24 || len(f.models) != 1 {
			t.Errorf("model names sent %v, want %q only", f.models, filepath.Base(dir))
		}
	})
}

// TestBenchFailsAfterWritingWhenRequestsFail: `tandem bench` against a
// server that refuses some requests writes its table and JSON and then
// exits non-zero naming the failed levels, unless --allow-failures says
// failures are expected; a rate search is held to the same rule.
func TestBenchFailsAfterWritingWhenRequestsFail(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name    string
		extra   []string
		wantErr string
	}{
		{"failures fail the command", nil, "requests failed: 2 of 4 against t at rate 100"},
		{"--allow-failures expects them", []string{"--allow-failures"}, ""},
		{"a rate search fails the same way", []string{"--search", "--search-low", "100", "--search-high", "100", "--slo-ttft", "1s"}, "requests failed: 2 of 4 against t at rate 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.Store(0)
			out := filepath.Join(t.TempDir(), "out.json")
			args := append([]string{"--target", "t=" + srv.URL, "--model", "m", "--vocab", "100", "--requests", "4", "--max-tokens", "2",
				"--rate", "100", "--progress", "0", "--json", out}, tc.extra...)
			err := runBench(args)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
			var s struct {
				Results []struct {
					Failed int `json:"failed"`
				} `json:"results"`
			}
			readJSON(t, out, &s)
			if len(s.Results) != 1 || s.Results[0].Failed != 2 {
				t.Errorf("results written: %+v, want the one level with its 2 failures", s.Results)
			}
		})
	}
}
