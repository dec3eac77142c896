package bench

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench/benchtest"
	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// TestPrepareWithoutModelsOrTokenize: a plan must work against a server
// that has neither /v1/models nor /tokenize (the tandem proxy has no
// /tokenize): with a model directory its tokenizer makes the prompt ids and
// the model is named by the directory's base name; with a bare model name
// the ids come from the stated default pool, with a warning; without a
// model it says to give one.
func TestPrepareWithoutModelsOrTokenize(t *testing.T) {
	stories := loaded.Stories(t)
	dir, tok := stories.Dir, stories.Tokenizer
	textPool, err := TextPool(tok.Encode(SampleText, false))
	if err != nil {
		t.Fatal(err)
	}
	plan := func(url, model string) *Plan {
		return &Plan{Targets: []Target{{Name: "a", URL: url}, {Name: "b", URL: url}}, Model: model}
	}
	source := func() *WorkloadSource {
		return &WorkloadSource{Spec: workload.Spec{Kind: "fixed", Requests: 2, PromptTokens: 8, MaxTokens: 2}}
	}

	t.Run("a model directory's tokenizer makes the ids", func(t *testing.T) {
		f, url := benchtest.NewCompletionsOnly(t)
		p := plan(url, dir)
		var log strings.Builder
		if err := Prepare(context.Background(), p, source(), &log); err != nil {
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
		if !slices.Contains(f.Other(), "/v1/models") || !slices.Contains(f.Other(), "/tokenize") {
			t.Errorf("paths tried %v, want /v1/models and /tokenize tried first", f.Other())
		}
	})
	t.Run("a bare name falls back to the default pool with a warning", func(t *testing.T) {
		_, url := benchtest.NewCompletionsOnly(t)
		p := plan(url, "smol")
		var log strings.Builder
		if err := Prepare(context.Background(), p, source(), &log); err != nil {
			t.Fatal(err)
		}
		if p.Model != "smol" || !slices.Equal(p.Pool, DefaultPool()) || p.Tokenize != nil || !strings.Contains(log.String(), "warning: no target serves /tokenize") {
			t.Errorf("model %q, pool %v, log %q", p.Model, p.Pool, log.String())
		}
	})
	t.Run("--tokenizer DIR with a bare name", func(t *testing.T) {
		_, url := benchtest.NewCompletionsOnly(t)
		p := plan(url, "smol")
		src := source()
		src.Tokenizer = dir
		if err := Prepare(context.Background(), p, src, &strings.Builder{}); err != nil {
			t.Fatal(err)
		}
		if p.Model != "smol" || !slices.Equal(p.Pool, textPool) {
			t.Errorf("model %q, pool of %d ids", p.Model, len(p.Pool))
		}
	})
	t.Run("no model name and no /v1/models", func(t *testing.T) {
		_, url := benchtest.NewCompletionsOnly(t)
		err := Prepare(context.Background(), plan(url, ""), source(), &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), "give --model") {
			t.Errorf("err = %v, want a hint to give --model", err)
		}
	})
}
