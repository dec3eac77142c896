package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// boundTokenizers are the tokenizers EncodeBounded is checked on: one of
// each pipeline the package supports.
func boundTokenizers(t *testing.T) map[string]*Tokenizer {
	fixtures := testmodels.TokenizerFixtures(t)
	out := map[string]*Tokenizer{}
	for name, path := range map[string]string{
		"SentencePiece with byte fallback": filepath.Join(testmodels.Stories260K(t), "tokenizer.json"),
		"byte-level Llama 3 style":         filepath.Join(fixtures, "llama3-style.json"),
		"byte-level GPT-2 style":           filepath.Join(fixtures, "gpt2-style.json"),
		"byte-level Qwen2 style":           filepath.Join(fixtures, "qwen2-style.json"),
	} {
		tok, err := LoadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = tok
	}
	return out
}

// boundTexts are long texts of several kinds: prose, prose with long
// whitespace runs and special tokens, one word without whitespace, digits,
// non-ASCII and invalid UTF-8.
func boundTexts() map[string]string {
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields(fixtureCorpus)
	var prose strings.Builder
	for prose.Len() < 5*boundChunkBytes {
		prose.WriteString(words[rng.IntN(len(words))])
		switch rng.IntN(20) {
		case 0:
			prose.WriteString("\n\n")
		case 1:
			prose.WriteString("      ")
		default:
			prose.WriteByte(' ')
		}
	}
	p := prose.String()
	return map[string]string{
		"prose":                     p,
		"prose with special tokens": strings.ReplaceAll(p, "sea", "<s>sea</s>"),
		"one long word":             strings.Repeat("abcdefghij", boundChunkBytes/3),
		"digits":                    strings.Repeat("0123456789", boundChunkBytes/4),
		"non-ASCII":                 strings.Repeat("日本語のテキスト、ünïcødé ", boundChunkBytes/8),
		"invalid UTF-8":             strings.Repeat("ab\xff\xfe cd\xc3", boundChunkBytes/3),
		"whitespace":                strings.Repeat(" \n\t ", boundChunkBytes),
	}
}

// TestEncodeBoundedIsEncodeForTextsThatFit: for a text that fits, the
// result is exactly Encode's, even at a limit of its exact length; a text
// with more tokens than the limit is refused.
func TestEncodeBoundedIsEncodeForTextsThatFit(t *testing.T) {
	for tname, tok := range boundTokenizers(t) {
		for xname, text := range boundTexts() {
			t.Run(tname+"/"+xname, func(t *testing.T) {
				for _, special := range []bool{false, true} {
					want := tok.Encode(text, special)
					got, ok := tok.EncodeBounded(text, special, len(want))
					if !ok || !slices.Equal(got, want) {
						t.Fatalf("special=%v: a text of %d tokens at a limit of %d: ok %v, %d ids (equal to Encode's: %v)", special, len(want), len(want), ok, len(got), slices.Equal(got, want))
					}
					if len(want) > 4*boundCutSlack*(len(text)/boundChunkBytes+1) {
						if _, ok := tok.EncodeBounded(text, special, len(want)/2); ok {
							t.Errorf("special=%v: a text of %d tokens passed a limit of %d", special, len(want), len(want)/2)
						}
					}
				}
			})
		}
	}
}

// TestEncodeBoundedAllocatesByTheLimitNotTheText: refusing a 10 MB prompt
// at a 2,048-token context allocates a few MB, where encoding it whole
// allocates hundreds.
func TestEncodeBoundedAllocatesByTheLimitNotTheText(t *testing.T) {
	text := strings.Repeat(fixtureCorpus, 10<<20/len(fixtureCorpus)+1)[:10<<20]
	for name, tok := range boundTokenizers(t) {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			ids, ok := tok.EncodeBounded(text, true, 2048)
			runtime.ReadMemStats(&after)
			if ok || ids != nil {
				t.Fatalf("a 10 MB prompt fit in 2048 tokens (%d ids)", len(ids))
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
				t.Errorf("refusing a 10 MB prompt allocated %d MB, want at most 16", got>>20)
			}
		})
	}
}
