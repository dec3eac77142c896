package tokenizer

import (
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// FuzzEncode checks that no input makes Encode, Decode or the stream decoder
// panic, and that byte-level tokenizers without a normalizer reproduce any
// valid UTF-8 text exactly. It always runs on a WriteFixture tokenizer, and
// on the shared fixtures when they are present.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{
		"", "a", "Hello world", " leading space", "double  space and\ttab\nnewline", "trailing spaces   ",
		"Ünïcödé ß 日本語 🙂 e\u0301", "don't  stop\r\nnow\u00a0nbsp", "1234567890 3.14159",
		"<|endoftext|><|im_start|>user\nhi<|im_end|>", "<s></s><unk>", "\xff\xfe invalid \xe6\x97",
	} {
		f.Add(s)
	}
	fixtureDir := f.TempDir()
	if _, err := WriteFixture(fixtureDir, FixtureOptions{VocabSize: 600}); err != nil {
		f.Fatal(err)
	}
	type subject struct {
		tok       *Tokenizer
		roundTrip bool // decode(encode(s)) == s for valid UTF-8
	}
	load := func(dir string) *Tokenizer {
		tok, err := Load(dir)
		if err != nil {
			f.Fatal(err)
		}
		return tok
	}
	subjects := []subject{{load(fixtureDir), true}}
	if root := testmodels.Root(); root != "" {
		fixtures := filepath.Join(root, "tokenizer-fixtures")
		for _, c := range []struct {
			name      string
			roundTrip bool
		}{{"llama3-style.json", true}, {"gpt2-style.json", true}, {"qwen2-style.json", false}} {
			tok, err := LoadFile(filepath.Join(fixtures, c.name))
			if err != nil {
				f.Fatal(err)
			}
			subjects = append(subjects, subject{tok, c.roundTrip})
		}
		subjects = append(subjects, subject{load(filepath.Join(root, "stories260K", "hf")), false})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, sub := range subjects {
			ids := sub.tok.Encode(s, false)
			for _, id := range ids {
				if id < 0 || int(id) >= sub.tok.VocabSize() {
					t.Fatalf("Encode(%q) produced id %d outside [0, %d)", s, id, sub.tok.VocabSize())
				}
			}
			got := sub.tok.Decode(ids, false)
			if sub.roundTrip && utf8.ValidString(s) && got != s {
				t.Fatalf("Decode(Encode(%q)) = %q", s, got)
			}
			d := NewDecoder(sub.tok, true, ids[:len(ids)/2])
			for _, id := range ids[len(ids)/2:] {
				d.Add(id)
			}
			d.Flush()
		}
	})
}
