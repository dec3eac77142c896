package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// Golden is the reference greedy run of the stories260K test model
// (golden_greedy.json beside its weights, written by the reference
// implementation): the prompt, the greedy continuation and the first
// logits.
type Golden struct {
	// PromptIDs is the prompt's token ids; it starts with BOS.
	PromptIDs []int32 `json:"prompt_ids"`
	// GreedyIDs is the prompt followed by the greedy continuation.
	GreedyIDs []int32 `json:"greedy_ids"`
	// GreedyText is the continuation's text.
	GreedyText string `json:"greedy_text"`
	// Logits0 is the first eight logits at position 0.
	Logits0 []float64 `json:"logits_pos0_first8"`
}

// StoriesGolden reads the stories260K golden greedy run. Where the shared
// models are missing the test is skipped (or, with
// TANDEM_REQUIRE_TESTDATA=1, failed), as package testmodels does.
func StoriesGolden(t testing.TB) Golden {
	t.Helper()
	g, err := ReadGolden(testmodels.Stories260K(t))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// ReadGolden reads golden_greedy.json from the model directory dir.
func ReadGolden(dir string) (Golden, error) {
	var g Golden
	b, err := os.ReadFile(filepath.Join(dir, "golden_greedy.json"))
	if err != nil {
		return g, fmt.Errorf("reading the golden greedy run: %w", err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("golden greedy run in %s: %w", dir, err)
	}
	return g, nil
}
