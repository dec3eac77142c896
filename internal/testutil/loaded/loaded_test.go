package loaded

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestStoriesLoadsOnceAndMatchesItsGolden(t *testing.T) {
	s := Stories(t)
	if s2 := Stories(t); s2 != s {
		t.Fatal("a second call loaded the model again")
	}
	if s.Model == nil || s.Tokenizer == nil || s.Dir == "" {
		t.Fatalf("incomplete model %+v", s)
	}
	g := testutil.StoriesGolden(t)
	// The tokenizer and the golden run agree: the continuation's ids decode
	// to the start of the golden text.
	cont := g.GreedyIDs[len(g.PromptIDs):]
	if text := s.Tokenizer.Decode(cont[:16], true); len(text) == 0 || g.GreedyText[:len(text)] != text {
		t.Errorf("the first 16 greedy ids decode to %q; golden text %q", text, g.GreedyText)
	}
	if s.Golden.GreedyText != g.GreedyText {
		t.Error("the loaded model's golden run differs from StoriesGolden")
	}
}
