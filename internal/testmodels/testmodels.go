// Package testmodels finds the shared test models (../shared/models beside the
// repository, or $TANDEM_MODELS) for tests. Where they are absent a test is
// skipped with a clear message, unless TANDEM_REQUIRE_TESTDATA=1, which CI sets
// so that a missing directory fails the run instead of silently passing it.
package testmodels

import (
	"os"
	"path/filepath"
	"testing"
)

// Root returns the models directory or "" if it cannot be found.
func Root() string {
	if d := os.Getenv("TANDEM_MODELS"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	// Walk up to the module root (the directory holding go.mod); the shared
	// models live beside it.
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			p := filepath.Join(d, "..", "shared", "models")
			if _, err := os.Stat(p); err == nil {
				return p
			}
			return ""
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// Dir returns the path of rel inside the models directory, skipping (or, with
// TANDEM_REQUIRE_TESTDATA=1, failing) the test when it is missing.
func Dir(t testing.TB, rel string) string {
	t.Helper()
	root := Root()
	p := filepath.Join(root, rel)
	if root == "" {
		missing(t, "the shared models directory (set TANDEM_MODELS or place it at ../shared/models beside the repository)")
		return ""
	}
	if _, err := os.Stat(p); err != nil {
		missing(t, p)
	}
	return p
}

// Stories260K returns the directory of the stories260K model in HF layout.
func Stories260K(t testing.TB) string { return Dir(t, "stories260K/hf") }

// TokenizerFixtures returns the tokenizer fixtures directory.
func TokenizerFixtures(t testing.TB) string { return Dir(t, "tokenizer-fixtures") }

// missing is testutil.Missing for the test models: testutil imports this
// package, so it cannot be used here.
func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("TANDEM_REQUIRE_TESTDATA") == "1" {
		t.Fatalf("test data missing: %s (TANDEM_REQUIRE_TESTDATA=1)", what)
	}
	t.Skipf("test data missing: %s", what)
}
