package experiment

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// TestExperimentModelIsCreatedOnceInTheCache: without --model the
// experiment makes a random-weight model in the user cache the first time
// and reuses it after (the tiny shape here; the command uses smollm2-135m).
func TestExperimentModelIsCreatedOnceInTheCache(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	var log strings.Builder
	dir, err := Model(&log, modelinit.ShapeTiny, "f32")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cache, "tandem", "models", "tiny-f32"); dir != want || !bench.IsTokenizerDir(dir) || !exists(filepath.Join(dir, "model.safetensors")) {
		t.Fatalf("model at %s (want %s), tokenizer %v", dir, want, bench.IsTokenizerDir(dir))
	}
	st, _ := os.Stat(filepath.Join(dir, "model.safetensors"))
	again, err := Model(&log, modelinit.ShapeTiny, "f32")
	if err != nil || again != dir {
		t.Fatalf("second call: %s, %v", again, err)
	}
	st2, _ := os.Stat(filepath.Join(dir, "model.safetensors"))
	if !st2.ModTime().Equal(st.ModTime()) || strings.Count(log.String(), "creating") != 1 {
		t.Errorf("the model was written twice:\n%s", log.String())
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "tandem", "models", "*.partial-*")); len(left) > 0 {
		t.Errorf("partial directories left: %v", left)
	}
}
