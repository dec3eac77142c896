package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

type goldenCase struct {
	Text    string   `json:"text"`
	IDs     []int32  `json:"ids"`
	Tokens  []string `json:"tokens"`
	Decoded *string  `json:"decoded"`
}

func readGolden(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
}

// checkGolden compares Encode, the token strings and Decode with what
// Hugging Face tokenizers produced for the same text.
func checkGolden(t *testing.T, tok *Tokenizer, c goldenCase) {
	t.Helper()
	ids := tok.Encode(c.Text, false)
	if diff := cmp.Diff(c.IDs, ids, cmp.Comparer(func(a, b []int32) bool {
		return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b))
	})); diff != "" {
		t.Errorf("Encode(%q) ids (-want +got):\n%s", c.Text, diff)
	}
	if c.Tokens != nil {
		got := make([]string, len(ids))
		for i, id := range ids {
			got[i] = tok.tokens[id]
		}
		if len(got) > 0 || len(c.Tokens) > 0 {
			if diff := cmp.Diff(c.Tokens, got); diff != "" {
				t.Errorf("Encode(%q) tokens (-want +got):\n%s", c.Text, diff)
			}
		}
	}
	if c.Decoded != nil {
		if got := tok.Decode(c.IDs, false); got != *c.Decoded {
			t.Errorf("Decode(%v) = %q, want %q", c.IDs, got, *c.Decoded)
		}
	}
}

func TestGoldenFixtures(t *testing.T) {
	dir := testmodels.TokenizerFixtures(t)
	var g struct {
		Files map[string][]goldenCase `json:"files"`
	}
	readGolden(t, filepath.Join(dir, "golden.json"), &g)
	if len(g.Files) == 0 {
		t.Fatal("golden.json has no files")
	}
	for name, cases := range g.Files {
		t.Run(name, func(t *testing.T) {
			tok, err := LoadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				t.Run(c.Text, func(t *testing.T) { checkGolden(t, tok, c) })
			}
		})
	}
}

func TestGoldenStories260K(t *testing.T) {
	dir := testmodels.Stories260K(t)
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	readGolden(t, filepath.Join(dir, "tokenizer_golden.json"), &g)
	if len(g.Cases) == 0 {
		t.Fatal("tokenizer_golden.json has no cases")
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Cases {
		t.Run(c.Text, func(t *testing.T) { checkGolden(t, tok, c) })
	}
}

// TestGoldenGemmaStyle checks a tiny tokenizer with the pipeline of Gemma's
// tokenizer.json (normalizer Replace " " → "▁", Split on " " merged with the
// previous piece, BPE with byte_fallback and fuse_unk, the ByteFallback
// decoder, <start_of_turn>/<end_of_turn> special tokens) against what
// Hugging Face tokenizers produced for it (scripts/reference/gemma_tokenizer.py
// builds both).
func TestGoldenGemmaStyle(t *testing.T) {
	dir := filepath.Join("testdata", "gemma")
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	readGolden(t, filepath.Join(dir, "golden.json"), &g)
	if len(g.Cases) == 0 {
		t.Fatal("golden.json has no cases")
	}
	tok, err := LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Cases {
		t.Run(c.Text, func(t *testing.T) { checkGolden(t, tok, c) })
	}
	// The post-processor's "<bos> $A".
	if ids := tok.Encode("Hello world", true); len(ids) == 0 || ids[0] != 2 {
		t.Errorf("Encode with special tokens = %v, want <bos> (2) first", ids)
	}
}
