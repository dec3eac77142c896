package tokenizer

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// writeGGUF writes a GGUF file with metadata kv and no tensors.
func writeGGUF(t testing.TB, kv []gguf.KV) string {
	t.Helper()
	var buf bytes.Buffer
	w, err := gguf.NewWriter(&buf, append([]gguf.KV{{Key: "general.architecture", Value: gguf.StringValue("llama")}}, kv...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tok.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// tok512KV is llama.cpp's SentencePiece metadata for the stories260K
// tokenizer built from the original llama2.c tok512.bin (its scores are the
// SentencePiece model's): tokens with spaces as "▁", <unk>, <s>, </s> as
// unknown and control tokens, <0xXX> as byte tokens.
func tok512KV(t testing.TB) []gguf.KV {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testmodels.Stories260K(t), "..", "tok512.bin"))
	if err != nil {
		t.Fatal(err)
	}
	var tokens []string
	var scores []float32
	var types []int32
	for off := 4; off < len(b); {
		score := math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
		n := int(binary.LittleEndian.Uint32(b[off+4:]))
		s := string(b[off+8 : off+8+n])
		off += 8 + n
		typ := int32(ggufTokenNormal)
		switch id := len(tokens); {
		case id == 0:
			s, typ = "<unk>", ggufTokenUnknown
		case id == 1:
			s, typ = "<s>", ggufTokenControl
		case id == 2:
			s, typ = "</s>", ggufTokenControl
		case id < 259:
			typ = ggufTokenByte
		}
		tokens = append(tokens, strings.ReplaceAll(s, " ", "▁"))
		scores = append(scores, score)
		types = append(types, typ)
	}
	if len(tokens) != 512 {
		t.Fatalf("tok512.bin has %d tokens", len(tokens))
	}
	return []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: gguf.StringValue("llama")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.ArrayValue(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.ArrayValue(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.ArrayValue(types)},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Uint32Value(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.Uint32Value(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: gguf.Uint32Value(0)},
	}
}

func storiesGolden(t *testing.T) []goldenCase {
	t.Helper()
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	readGolden(t, filepath.Join(testmodels.Stories260K(t), "tokenizer_golden.json"), &g)
	var f struct {
		Files map[string][]goldenCase `json:"files"`
	}
	readGolden(t, filepath.Join(testmodels.TokenizerFixtures(t), "golden.json"), &f)
	return append(g.Cases, f.Files["../stories260K/hf/tokenizer.json"]...)
}

// TestGGUFTok512MatchesHF checks llama.cpp's SentencePiece merging with the
// original scores of tok512.bin against Hugging Face's tokenizer.json BPE
// for the same vocabulary on every golden case of both golden files.
func TestGGUFTok512MatchesHF(t *testing.T) {
	tok, err := LoadGGUF(writeGGUF(t, tok512KV(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range storiesGolden(t) {
		t.Run(c.Text, func(t *testing.T) { checkGolden(t, tok, c) })
	}
	if ids := tok.Encode("Hi", true); len(ids) == 0 || ids[0] != 1 {
		t.Errorf("Encode with specials = %v, want BOS first", ids)
	}
	if eos := tok.EOS(); len(eos) != 1 || eos[0] != 2 || !tok.IsSpecial(1) {
		t.Errorf("EOS %v", eos)
	}
}

// TestGGUFMetadataRoundTrip writes Hugging Face tokenizers (stories260K's
// SentencePiece-style BPE and the three byte-level fixtures) to GGUF
// metadata and checks that the GGUF tokenizer encodes every golden case as
// Hugging Face does and keeps specials, BOS/EOS and the chat template.
func TestGGUFMetadataRoundTrip(t *testing.T) {
	fixtures := testmodels.TokenizerFixtures(t)
	var f struct {
		Files map[string][]goldenCase `json:"files"`
	}
	readGolden(t, filepath.Join(fixtures, "golden.json"), &f)
	dirs := map[string]string{"stories260K": testmodels.Stories260K(t)}
	cases := map[string][]goldenCase{"stories260K": storiesGolden(t)}
	for _, name := range []string{"llama3-style.json", "qwen2-style.json", "gpt2-style.json"} {
		dir := t.TempDir()
		b, err := os.ReadFile(filepath.Join(fixtures, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[name], cases[name] = dir, f.Files[name]
	}
	// Gemma's pipeline: Split on " " after a normalizer that leaves no
	// spaces, written as GGUF's SentencePiece-style "llama" model.
	var gemma struct {
		Cases []goldenCase `json:"cases"`
	}
	readGolden(t, filepath.Join("testdata", "gemma", "golden.json"), &gemma)
	dirs["gemma-style"], cases["gemma-style"] = filepath.Join("testdata", "gemma"), gemma.Cases
	chat := t.TempDir()
	fx, err := WriteFixture(chat, FixtureOptions{VocabSize: 1200, ChatTemplate: true})
	if err != nil {
		t.Fatal(err)
	}
	dirs["fixture with chat template"] = chat
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			hf, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			kv, err := GGUFMetadata(dir, hf.VocabSize()+5)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := LoadGGUF(writeGGUF(t, kv))
			if err != nil {
				t.Fatal(err)
			}
			if tok.VocabSize() != hf.VocabSize()+5 || tok.TokenText(int32(hf.VocabSize())) != "[PAD"+itoa(hf.VocabSize())+"]" {
				t.Errorf("vocab %d (padding token %q), want %d", tok.VocabSize(), tok.TokenText(int32(hf.VocabSize())), hf.VocabSize()+5)
			}
			for _, c := range cases[name] {
				t.Run(c.Text, func(t *testing.T) { checkGolden(t, tok, c) })
			}
			texts := []string{"Once upon a time, there was a little girl.", " two  spaces\tand\nnewlines 12345", "héllo wörld 😀"}
			for _, text := range texts {
				for _, special := range []bool{false, true} {
					want, got := hf.Encode(text, special), tok.Encode(text, special)
					if !equalIDs(want, got) {
						t.Errorf("Encode(%q, %t) = %v, Hugging Face %v", text, special, got, want)
					}
					if g, w := tok.Decode(got, true), hf.Decode(want, true); g != w {
						t.Errorf("Decode = %q, Hugging Face %q", g, w)
					}
				}
			}
			hb, hok := hf.BOS()
			gb, gok := tok.BOS()
			if hb != gb || hok != gok || !equalIDs(hf.EOS(), tok.EOS()) {
				t.Errorf("BOS %d %t EOS %v, Hugging Face %d %t %v", gb, gok, tok.EOS(), hb, hok, hf.EOS())
			}
			if hf.HasChatTemplate() != tok.HasChatTemplate() {
				t.Fatalf("chat template: %t, Hugging Face %t", tok.HasChatTemplate(), hf.HasChatTemplate())
			}
			if hf.HasChatTemplate() {
				msgs := []Message{{Role: "user", Content: "Hi there"}}
				a, errA := hf.ApplyChatTemplate(msgs, true)
				b, errB := tok.ApplyChatTemplate(msgs, true)
				if a != b || errA != nil || errB != nil {
					t.Errorf("chat: %q (%v), Hugging Face %q (%v)", b, errB, a, errA)
				}
				if ids := tok.Encode(b, false); !equalIDs(ids, hf.Encode(a, false)) || !tok.IsSpecial(fx.EOS) {
					t.Errorf("chat prompt ids %v differ from Hugging Face's", ids)
				}
			}
		})
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

func TestGGUFTokenizerErrors(t *testing.T) {
	base := func(model string, extra ...gguf.KV) []gguf.KV {
		return append([]gguf.KV{
			{Key: "tokenizer.ggml.model", Value: gguf.StringValue(model)},
			{Key: "tokenizer.ggml.tokens", Value: gguf.ArrayValue([]string{"a", "b", "ab"})},
		}, extra...)
	}
	merges := gguf.KV{Key: "tokenizer.ggml.merges", Value: gguf.ArrayValue([]string{"a b"})}
	cases := []struct {
		name string
		kv   []gguf.KV
		want string
	}{
		{"no tokenizer", nil, "tokenizer.ggml.model is missing"},
		{"unknown model", base("bert"), `tokenizer.ggml.model "bert" is not supported`},
		{"unknown pre", base("gpt2", merges, gguf.KV{Key: "tokenizer.ggml.pre", Value: gguf.StringValue("deepseek-coder")}), `tokenizer.ggml.pre "deepseek-coder" is not a pre-tokenizer Tandem knows`},
		{"no merges", base("gpt2"), "needs tokenizer.ggml.merges"},
		{"bad merge", base("gpt2", gguf.KV{Key: "tokenizer.ggml.merges", Value: gguf.ArrayValue([]string{"a c"})}), "missing from the vocabulary"},
		{"merge without a space", base("gpt2", gguf.KV{Key: "tokenizer.ggml.merges", Value: gguf.ArrayValue([]string{"ab"})}), "has no space"},
		{"short token types", base("llama", gguf.KV{Key: "tokenizer.ggml.token_type", Value: gguf.ArrayValue([]int32{1})}), "must be 3 int32s"},
		{"scores of the wrong type", base("llama", gguf.KV{Key: "tokenizer.ggml.scores", Value: gguf.ArrayValue([]float64{1, 2, 3})}), "must be 3 float32s"},
		{"tokens not strings", []gguf.KV{{Key: "tokenizer.ggml.model", Value: gguf.StringValue("llama")}, {Key: "tokenizer.ggml.tokens", Value: gguf.ArrayValue([]int32{1})}}, "array of strings"},
		{"add_bos without bos", base("gpt2", merges, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: gguf.BoolValue(true)}), "no bos_token_id"},
		{"bool of the wrong type", base("llama", gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: gguf.Uint8Value(1)}), "expected a bool"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadGGUF(writeGGUF(t, c.kv))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
	// A minimal gpt2 tokenizer works, with the default pre-tokenizer.
	tok, err := LoadGGUF(writeGGUF(t, base("gpt2", merges)))
	if err != nil {
		t.Fatal(err)
	}
	if ids := tok.Encode("ab", true); !equalIDs(ids, []int32{2}) {
		t.Errorf("Encode(ab) = %v", ids)
	}
}
