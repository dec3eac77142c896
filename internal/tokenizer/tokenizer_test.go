package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// patched loads the tokenizer.json at path after edit has changed its JSON.
func patched(t *testing.T, path string, edit func(map[string]any)) *Tokenizer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out := filepath.Join(t.TempDir(), "tokenizer.json")
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func addedTokenMap(id int, content string, edit func(map[string]any)) map[string]any {
	m := map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false,
		"rstrip": false, "normalized": false, "special": true}
	if edit != nil {
		edit(m)
	}
	return m
}

// The expected ids in these tables were produced by Hugging Face tokenizers
// 0.23.2 (npm "tokenizers") on the same patched tokenizer.json files.
func TestEncodeMatchesReferenceOnVariants(t *testing.T) {
	stories := filepath.Join(testmodels.Stories260K(t), "tokenizer.json")
	gpt2 := filepath.Join(testmodels.TokenizerFixtures(t), "gpt2-style.json")

	metaspace := patched(t, stories, func(m map[string]any) {
		ms := map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
		m["normalizer"], m["pre_tokenizer"], m["decoder"] = nil, ms, ms
	})
	flags := patched(t, gpt2, func(m map[string]any) {
		m["added_tokens"] = append(m["added_tokens"].([]any),
			addedTokenMap(1257, "<mask>", func(a map[string]any) { a["lstrip"] = true }),
			addedTokenMap(1258, "[R]", func(a map[string]any) { a["rstrip"] = true }),
			addedTokenMap(1259, "cat", func(a map[string]any) { a["single_word"], a["special"], a["normalized"] = true, false, true }),
			addedTokenMap(1260, "dog", func(a map[string]any) { a["special"], a["normalized"] = false, true }),
		)
	})
	tests := []struct {
		name        string
		tok         *Tokenizer
		text        string
		want        []int32
		wantDecoded string // Decode(want, false)
	}{
		{"Metaspace prepends to the first word", metaspace, "Hello world", []int32{346, 306, 414, 263, 304, 341}, "Hello world"},
		{"Metaspace does not double a leading space", metaspace, " leading space", []int32{278, 411, 380, 299, 262, 427, 412, 331}, "leading space"},
		{"Metaspace keeps a run of spaces", metaspace, "double  space", []int32{279, 277, 430, 305, 410, 262, 427, 412, 331}, "double  space"},
		{"Metaspace prepends only at the very start with scheme first", metaspace, "Tim <s> went </s>x", []int32{326, 410, 1, 263, 377, 410, 2, 444}, "Tim <s> went </s>x"},
		{"Metaspace after a leading special token", metaspace, "<s>Hello", []int32{1, 440, 411, 306, 414}, ""},
		{"Metaspace with byte fallback", metaspace, "日本 a", []int32{410, 233, 154, 168, 233, 159, 175, 261}, ""},
		{"lstrip swallows the spaces before a token", flags, "a  <mask> b", []int32{97, 1257, 273}, "a<mask> b"},
		{"rstrip swallows the spaces after a token", flags, "x[R]   y", []int32{120, 1258, 121}, ""},
		{"single_word matches whole words only", flags, "cat concat cats cat.", []int32{1259, 376, 99, 267, 268, 267, 115, 32, 1259, 46}, ""},
		{"a plain added token matches inside words", flags, "hotdog dog", []int32{104, 322, 1260, 32, 1260}, ""},
		{"adjacent added tokens", flags, "<mask><mask>", []int32{1257, 1257}, ""},
		{"lstrip at the start of the text", flags, "  <mask>", []int32{1257}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.tok.Encode(tc.text, false)); diff != "" {
				t.Errorf("Encode(%q) (-want +got):\n%s", tc.text, diff)
			}
			if tc.wantDecoded != "" {
				if got := tc.tok.Decode(tc.want, false); got != tc.wantDecoded {
					t.Errorf("Decode = %q, want %q", got, tc.wantDecoded)
				}
			}
		})
	}
}

// Decoding ids whose bytes are not valid UTF-8 must give the reference's
// replacement characters: per byte for byte fallback, per maximal invalid
// subsequence for byte-level.
func TestDecodeInvalidUTF8MatchesReference(t *testing.T) {
	stories, err := Load(testmodels.Stories260K(t))
	if err != nil {
		t.Fatal(err)
	}
	gpt2, err := LoadFile(filepath.Join(testmodels.TokenizerFixtures(t), "gpt2-style.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tok  *Tokenizer
		ids  []int32
		skip bool
		want string
	}{
		{"byte-level truncated, valid, stray and dangling bytes", gpt2, []int32{230, 151, 97, 151, 230, 151, 165, 151}, false, "\uFFFDa\uFFFD日\uFFFD"},
		{"byte-level truncated four-byte character", gpt2, []int32{240, 159, 153}, false, "\uFFFD"},
		{"byte fallback: an invalid run is one U+FFFD per byte", stories, []int32{233, 154, 414, 233, 154, 168, 154, 410, 233}, false, "\uFFFD\uFFFDo\uFFFD\uFFFD\uFFFD\uFFFD \uFFFD"},
		{"special tokens are decoded through the decoder", stories, []int32{326, 269, 301, 425, 411, 263, 377, 267, 265, 410, 451, 347, 443, 410, 1, 410, 410, 2, 410, 410, 0}, false, "Tim and Sue went to the zoo! <s>  </s>  <unk>"},
		{"skipping special tokens", stories, []int32{326, 269, 301, 425, 411, 263, 377, 267, 265, 410, 451, 347, 443, 410, 1, 410, 410, 2, 410, 410, 0}, true, "Tim and Sue went to the zoo!     "},
		{"unknown ids are ignored", stories, []int32{-1, 346, 99999}, false, "He"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.tok.Decode(tc.ids, tc.skip); got != tc.want {
				t.Errorf("Decode(%v, %v) = %q, want %q", tc.ids, tc.skip, got, tc.want)
			}
		})
	}
}

func TestSpecialTokensAndAccessors(t *testing.T) {
	stories, err := Load(testmodels.Stories260K(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := testmodels.TokenizerFixtures(t)
	load := func(name string) *Tokenizer {
		tok, err := LoadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	llama3, qwen2 := load("llama3-style.json"), load("qwen2-style.json")
	tests := []struct {
		name      string
		tok       *Tokenizer
		text      string
		want      []int32
		bos       int32
		hasBOS    bool
		eos       []int32
		vocabSize int
	}{
		{"add_bos_token from tokenizer_config.json", stories, "a", []int32{1, 261}, 1, true, []int32{2}, 512},
		{"TemplateProcessing adds Llama 3's begin_of_text", llama3, "a", []int32{1256, 97}, 1256, true, nil, 1259},
		{"no post-processor template adds nothing", qwen2, "a", []int32{97}, 0, false, nil, 1259},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.tok.Encode(tc.text, true)); diff != "" {
				t.Errorf("Encode(%q, true) (-want +got):\n%s", tc.text, diff)
			}
			if bos, ok := tc.tok.BOS(); ok != tc.hasBOS || ok && bos != tc.bos {
				t.Errorf("BOS() = %d, %v; want %d, %v", bos, ok, tc.bos, tc.hasBOS)
			}
			if diff := cmp.Diff(tc.eos, tc.tok.EOS()); diff != "" {
				t.Errorf("EOS() (-want +got):\n%s", diff)
			}
			if got := tc.tok.VocabSize(); got != tc.vocabSize {
				t.Errorf("VocabSize() = %d, want %d", got, tc.vocabSize)
			}
		})
	}

	texts := []struct {
		tok     *Tokenizer
		token   string
		want    string
		special bool
	}{
		{stories, "▁Once", " Once", false},
		{stories, "<0xE6>", `bytes:\xe6`, false},
		{stories, "<0x0A>", "\n", false},
		{stories, "<s>", "<s>", true},
		{qwen2, "Ġthe", " the", false},
		{qwen2, "æ", `bytes:\xe6`, false},
		{qwen2, "<|im_end|>", "<|im_end|>", true},
	}
	for _, tc := range texts {
		t.Run("TokenText of "+tc.token, func(t *testing.T) {
			id, ok := tc.tok.TokenID(tc.token)
			if !ok {
				t.Fatalf("TokenID(%q) not found", tc.token)
			}
			if got := tc.tok.TokenText(id); got != tc.want {
				t.Errorf("TokenText(%d) = %q, want %q", id, got, tc.want)
			}
			if got := tc.tok.IsSpecial(id); got != tc.special {
				t.Errorf("IsSpecial(%d) = %v, want %v", id, got, tc.special)
			}
		})
	}
	if got := stories.TokenText(-5) + stories.TokenText(1<<20); got != "" {
		t.Errorf("TokenText of unknown ids = %q, want empty", got)
	}
}

func TestLoadRejectsWhatItCannotReproduce(t *testing.T) {
	path := filepath.Join(testmodels.TokenizerFixtures(t), "gpt2-style.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"an unsupported model type", func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }, `model type "Unigram" is not supported`},
		{"an unknown decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "CTC"} }, `decoder type "CTC"`},
		{"an unknown pre-tokenizer inside a sequence", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "BertPreTokenizer"}}}
		}, `sequence item 0: pre_tokenizer type "BertPreTokenizer"`},
		{"a merge of unknown tokens", func(m map[string]any) {
			mod := m["model"].(map[string]any)
			mod["merges"] = append(mod["merges"].([]any), []any{"nope", "x"})
		}, "missing from the vocabulary"},
		{"a bad regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(["}, "behavior": "Isolated"}
		}, "compile regex"},
		{"a malformed merge", func(m map[string]any) {
			mod := m["model"].(map[string]any)
			mod["merges"] = []any{"nospace"}
		}, "no space"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			tc.edit(m)
			b, _ := json.Marshal(m)
			p := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadFile(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadFile error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("a missing directory", func(t *testing.T) {
		if _, err := Load(filepath.Join(t.TempDir(), "absent")); err == nil {
			t.Fatal("Load of a missing directory succeeded")
		}
	})
}

func TestSplitBehaviors(t *testing.T) {
	re, err := compileRegex(`-`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Isolated", false, []string{"a", "-", "b", "-", "-", "c"}},
		{"Removed", false, []string{"a", "b", "c"}},
		{"MergedWithPrevious", false, []string{"a-", "b-", "-", "c"}},
		{"MergedWithNext", false, []string{"a", "-b", "-", "-c"}},
		{"Contiguous", false, []string{"a", "-", "b", "--", "c"}},
		{"Removed", true, []string{"-", "-", "-"}},
	}
	for _, tc := range tests {
		t.Run(tc.behavior, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, splitRegex(re, "a-b--c", tc.behavior, tc.invert)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestConcurrentEncode runs Encode and Decode from many goroutines (run with
// -race) and checks every result against a sequential run.
func TestConcurrentEncode(t *testing.T) {
	tok, err := LoadFile(filepath.Join(testmodels.TokenizerFixtures(t), "llama3-style.json"))
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Fields(benchParagraph)
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s+" "+s, true)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range texts {
				j := (i + g*7) % len(texts)
				s := texts[j] + " " + texts[j]
				ids := tok.Encode(s, true)
				if !cmp.Equal(ids, want[j]) || tok.Decode(ids, true) != s {
					t.Errorf("goroutine %d: %q encoded to %v, want %v", g, s, ids, want[j])
					return
				}
			}
		})
	}
	wg.Wait()
}
