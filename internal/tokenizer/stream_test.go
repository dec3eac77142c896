package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// streamAll feeds out to a StreamDecoder and returns every piece it released.
func streamAll(tok *Tokenizer, skip bool, prompt, out []int32) []string {
	d := NewDecoder(tok, skip, prompt)
	var pieces []string
	for _, id := range out {
		pieces = append(pieces, d.Add(id))
	}
	return append(pieces, d.Flush())
}

func TestStreamDecoderCases(t *testing.T) {
	stories, err := Load(testmodels.Stories260K(t))
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string) []int32 { return stories.Encode(s, false) }
	bos := []int32{1}
	tests := []struct {
		name   string
		prompt []int32
		out    []int32
		skip   bool
		want   []string // what each Add released, then Flush
	}{
		{
			name:   "first word after a prompt keeps its leading space",
			prompt: enc("Once upon"), out: enc("a time"),
			want: []string{" a", " time", ""},
		},
		{
			name: "first word of a completion without prompt loses its space as in Decode",
			out:  enc("a time"),
			want: []string{"a", " time", ""},
		},
		{
			name:   "a character split over byte tokens is held until complete",
			prompt: bos, out: enc("日本"), skip: true,
			// "日本" is "▁" then six byte tokens.
			want: []string{"", "", "", "日", "", "", "本", ""},
		},
		{
			name:   "an incomplete character is flushed as U+FFFD",
			prompt: bos, out: enc("日")[:3], skip: true,
			want: []string{"", "", "", "\uFFFD\uFFFD"},
		},
		{
			name:   "skipped special tokens release nothing",
			prompt: bos, out: append(enc("a"), 2), skip: true,
			want: []string{"a", "", ""},
		},
		{
			name:   "kept special tokens are released as text, and the BOS text keeps the space after it",
			prompt: bos, out: append(enc("a"), 2),
			want: []string{" a", "</s>", ""},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := streamAll(stories, tc.skip, tc.prompt, tc.out)
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("released %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStreamDecoderMatchesDecode is the streaming property: for random
// prompts and completions, the concatenated stream equals the text the
// completion adds to Decode(prompt), and no piece is broken UTF-8.
func TestStreamDecoderMatchesDecode(t *testing.T) {
	fixtures := testmodels.TokenizerFixtures(t)
	for _, tc := range []struct {
		name string
		path string
	}{
		{"SentencePiece with byte fallback", filepath.Join(testmodels.Stories260K(t), "tokenizer.json")},
		{"byte-level Llama 3 style", filepath.Join(fixtures, "llama3-style.json")},
		{"byte-level GPT-2 style", filepath.Join(fixtures, "gpt2-style.json")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := LoadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			checked := 0
			for iter := range 3000 {
				prompt := randomIDs(tok, rng, rng.IntN(8))
				out := randomIDs(tok, rng, rng.IntN(24))
				skip := iter%2 == 0
				pieces := streamAll(tok, skip, prompt, out)
				for _, p := range pieces {
					if !utf8.ValidString(p) {
						t.Fatalf("released invalid UTF-8 %q (prompt %v, out %v)", p, prompt, out)
					}
				}
				before := tok.Decode(prompt, skip)
				all := tok.Decode(append(append([]int32(nil), prompt...), out...), skip)
				if !strings.HasPrefix(all, before) {
					continue // the prompt ended inside a character
				}
				checked++
				if got, want := strings.Join(pieces, ""), all[len(before):]; got != want {
					t.Fatalf("stream %q, want %q\nprompt %v\nout %v\nskip %v", got, want, prompt, out, skip)
				}
			}
			if checked < 2000 {
				t.Errorf("only %d of 3000 cases had a clean prompt prefix", checked)
			}
		})
	}
}

// randomIDs draws n tokens: ordinary tokens, special tokens, and the tokens
// of random characters, which for SentencePiece models are runs of
// byte-fallback tokens. Byte-level tokens are drawn freely, including lone
// bytes of multi-byte characters; byte-fallback runs are kept whole because
// the reference turns an invalid run into one U+FFFD per byte, which later
// tokens can change retroactively and no streaming method can follow.
func randomIDs(tok *Tokenizer, rng *rand.Rand, n int) []int32 {
	var ids []int32
	byteFallback := tok.model.(*bpe).byteFallback
	for len(ids) < n {
		switch k := rng.IntN(10); {
		case k < 6:
			id := rng.Int32N(int32(tok.VocabSize()))
			if _, isByte := parseByteToken(tok.tokens[id]); isByte && byteFallback {
				continue
			}
			ids = append(ids, id)
		case k < 7:
			ids = append(ids, int32(rng.IntN(3))) // stories' <unk>, <s>, </s>; plain bytes elsewhere
		default:
			r := []rune{'é', '日', '🙂', 'ß', ' ', 'x'}[rng.IntN(6)]
			ids = append(ids, tok.Encode(string(r), false)...)
		}
	}
	return ids
}
