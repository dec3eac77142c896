package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStoriesGolden(t *testing.T) {
	g := StoriesGolden(t)
	if len(g.PromptIDs) == 0 || len(g.GreedyIDs) <= len(g.PromptIDs) || g.GreedyText == "" || len(g.Logits0) != 8 {
		t.Fatalf("golden run %d prompt ids, %d greedy ids, %d bytes of text, %d logits", len(g.PromptIDs), len(g.GreedyIDs), len(g.GreedyText), len(g.Logits0))
	}
	for i, id := range g.PromptIDs {
		if g.GreedyIDs[i] != id {
			t.Fatalf("greedy ids %v do not start with the prompt %v", g.GreedyIDs[:len(g.PromptIDs)], g.PromptIDs)
		}
	}
}

func TestReadGoldenSaysWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadGolden(dir); err == nil {
		t.Error("no error for a directory without golden_greedy.json")
	}
	if err := os.WriteFile(filepath.Join(dir, "golden_greedy.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadGolden(dir); err == nil {
		t.Error("no error for a malformed golden_greedy.json")
	}
}
