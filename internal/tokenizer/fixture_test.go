package tokenizer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFixture(t *testing.T) {
	tests := []struct {
		name      string
		opts      FixtureOptions
		wantSize  int // exact tokenizer vocabulary size; 0 means "at most opts.VocabSize"
		wantChat  bool
		wantEOS   string
		minMerges int
	}{
		{name: "smallest vocabulary has only bytes and specials", opts: FixtureOptions{VocabSize: 259}, wantSize: 259, wantEOS: "<|endoftext|>"},
		{name: "small vocabulary is filled with merges", opts: FixtureOptions{VocabSize: 512}, wantSize: 512, wantEOS: "<|endoftext|>"},
		{name: "large vocabulary stops at the merge cap", opts: FixtureOptions{VocabSize: 32000, ChatTemplate: true}, wantChat: true, wantEOS: "<|im_end|>", minMerges: 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fx, err := WriteFixture(dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantSize != 0 && fx.VocabSize != tc.wantSize {
				t.Errorf("VocabSize = %d, want %d", fx.VocabSize, tc.wantSize)
			}
			if fx.VocabSize > tc.opts.VocabSize || fx.VocabSize < 259+tc.minMerges {
				t.Errorf("VocabSize = %d, want between %d and %d", fx.VocabSize, 259+tc.minMerges, tc.opts.VocabSize)
			}
			tok, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != fx.VocabSize {
				t.Errorf("loaded VocabSize() = %d, fixture says %d", tok.VocabSize(), fx.VocabSize)
			}
			if bos, ok := tok.BOS(); !ok || bos != fx.BOS {
				t.Errorf("BOS() = %d, %v; want %d, true", bos, ok, fx.BOS)
			}
			if eos := tok.EOS(); len(eos) != 1 || eos[0] != fx.EOS || tok.tokens[fx.EOS] != tc.wantEOS {
				t.Errorf("EOS() = %v, want [%d] (%s)", eos, fx.EOS, tc.wantEOS)
			}
			for _, text := range []string{
				"Once upon a time, the server sent 1,024 tokens.",
				"  odd\twhitespace\r\n and ünïcödé 日本語 🙂",
				"<|im_start|>user\nhi<|im_end|>",
			} {
				ids := tok.Encode(text, true)
				if got := tok.Decode(ids, false); got != text {
					t.Errorf("Decode(Encode(%q)) = %q", text, got)
				}
			}
			if n := len(tok.Encode("Once upon a time, there lived a girl.", false)); tc.opts.VocabSize >= 512 && n > 20 {
				t.Errorf("corpus-like sentence took %d tokens; merges are not being used", n)
			}
			if tok.HasChatTemplate() != tc.wantChat {
				t.Fatalf("HasChatTemplate() = %v, want %v", tok.HasChatTemplate(), tc.wantChat)
			}
			if !tc.wantChat {
				return
			}
			got, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "Hi there"}}, true)
			if err != nil {
				t.Fatal(err)
			}
			if want := "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"; got != want {
				t.Errorf("chat template rendered %q, want %q", got, want)
			}
			if ids := tok.Encode(got, false); ids[0] != fx.BOS+1 {
				t.Errorf("rendered prompt starts with id %d, want <|im_start|> (%d)", ids[0], fx.BOS+1)
			}
		})
	}
}

func TestWriteFixtureIsDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	opts := FixtureOptions{VocabSize: 1024, ChatTemplate: true}
	if _, err := WriteFixture(a, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFixture(b, opts); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		x, err := os.ReadFile(filepath.Join(a, name))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs", name)
		}
	}
}

func TestWriteFixtureRejectsTinyVocabulary(t *testing.T) {
	_, err := WriteFixture(t.TempDir(), FixtureOptions{VocabSize: 100})
	if err == nil || !strings.Contains(err.Error(), "at least 259") {
		t.Fatalf("err = %v, want one naming the minimum size 259", err)
	}
}

func TestFixtureEveryIDDecodesToText(t *testing.T) {
	dir := t.TempDir()
	fx, err := WriteFixture(dir, FixtureOptions{VocabSize: 5000, ChatTemplate: true})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fx.VocabSize != 5000 || tok.VocabSize() != 5000 {
		t.Fatalf("fixture has %d ids (loaded: %d), want 5000", fx.VocabSize, tok.VocabSize())
	}
	seen := map[string]int32{}
	for id := int32(256); id < int32(fx.VocabSize); id++ {
		if tok.IsSpecial(id) {
			continue
		}
		s := tok.Decode([]int32{id}, true)
		if s == "" {
			t.Fatalf("id %d decodes to no text", id)
		}
		if prev, dup := seen[s]; dup {
			t.Fatalf("ids %d and %d both decode to %q", prev, id, s)
		}
		seen[s] = id
	}
}
