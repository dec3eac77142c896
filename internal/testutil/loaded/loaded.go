// Package loaded loads the stories260K test model once per test binary and
// shares it between the tests that need a real model in memory. It is apart
// from package testutil because it imports packages model and tokenizer,
// whose own tests could then not import testutil.
package loaded

import (
	"sync"
	"testing"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Model is a test model in memory: its directory, weights, tokenizer and
// golden greedy run. It is shared, so it is read-only: an engine built on it
// owns its KV pool, but no test may Close the model. Its weights run on a
// one-thread tensor pool, which several engines may share (package tensor
// runs a call that finds the pool busy on the caller's goroutine).
type Model struct {
	// Dir is the model directory (Hugging Face layout).
	Dir string
	// Model is the loaded model.
	Model *model.Model
	// Tokenizer is the model's tokenizer.
	Tokenizer *tokenizer.Tokenizer
	// Golden is the model's golden greedy run.
	Golden testutil.Golden
}

var stories struct {
	once sync.Once
	m    *Model
	err  error
}

// Stories returns stories260K, loaded on the first call. Where the shared
// models are missing the test is skipped (or, with
// TANDEM_REQUIRE_TESTDATA=1, failed), as package testmodels does; a model
// that does not load fails every test that asks for it.
func Stories(t testing.TB) *Model {
	t.Helper()
	dir := testmodels.Stories260K(t)
	stories.once.Do(func() {
		golden, err := testutil.ReadGolden(dir)
		if err != nil {
			stories.err = err
			return
		}
		m, err := model.Load(dir, tensor.NewPool(1))
		if err != nil {
			stories.err = err
			return
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			m.Close()
			stories.err = err
			return
		}
		stories.m = &Model{Dir: dir, Model: m, Tokenizer: tok, Golden: golden}
	})
	if stories.err != nil {
		t.Fatalf("loading stories260K from %s: %v", dir, stories.err)
	}
	return stories.m
}
