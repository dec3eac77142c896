package tokenizer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// ignoreMergesKey records a byte-level BPE tokenizer's ignore_merges when it
// differs from what its tokenizer.ggml.pre name implies to llama.cpp
// (llama-bpe implies true). llama.cpp does not read it; FromGGUF does.
const ignoreMergesKey = "tandem.tokenizer.ignore_merges"

// GGUFMetadata returns the tokenizer.* metadata, in llama.cpp's keys, of the
// Hugging Face tokenizer in dir (tokenizer.json with tokenizer_config.json,
// chat_template.jinja and generation_config.json as Load reads them), for a
// GGUF model with vocab logits: the token list is padded to vocab with
// "[PADn]" tokens of type unused, as llama.cpp's converter does.
//
// A byte-level BPE tokenizer becomes tokenizer.ggml.model "gpt2" with its
// merges and the tokenizer.ggml.pre name of its pre-tokenizer: llama-bpe
// (the Llama 3 split regex), qwen2 (the Qwen2 regex, with NFC), gpt-2
// (ByteLevel with its own regex) or smollm (single digits, then the GPT-2
// regex); any other pre-tokenizer or normalizer is an error, since GGUF has
// no way to say what it does. A SentencePiece-style BPE (spaces replaced by
// "▁", optionally prepended, no other splitting) becomes model "llama" with
// scores that order its tokens as its merges do (−rank of the first merge
// producing a token, 0 for single characters, −1e9 for longer tokens no merge
// produces). Added tokens are typed control (special) or user-defined;
// <0xXX> tokens byte; the unknown token unknown.
//
// The special ids are the tokenizer's BOS, the first EOS as eos and any
// further end-of-generation ids as eot and eom; add_bos_token and
// add_eos_token say what Encode adds; the chat template is written when
// there is one.
func GGUFMetadata(dir string, vocab int) ([]gguf.KV, error) {
	t, err := Load(dir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "tokenizer.json")
	var f fileJSON
	if err := readJSON(path, &f); err != nil {
		return nil, err
	}
	if vocab < len(t.tokens) {
		return nil, fmt.Errorf("tokenizer: %s has %d tokens, more than the model's %d logits", path, len(t.tokens), vocab)
	}
	tokens := make([]string, vocab)
	types := make([]int32, vocab)
	for i := range tokens {
		tokens[i], types[i] = t.tokenAt(i), ggufTokenNormal
		if tokens[i] == "" {
			tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), ggufTokenUnused
		}
	}
	for _, a := range f.AddedTokens {
		types[a.ID] = ggufTokenUserDefined
		if a.Special {
			types[a.ID] = ggufTokenControl
		}
	}
	kv := []gguf.KV{}
	add := func(key string, v gguf.Value) { kv = append(kv, gguf.KV{Key: key, Value: v}) }

	merges := make([][2]string, len(f.Model.Merges))
	for i, raw := range f.Model.Merges {
		if merges[i][0], merges[i][1], err = parseMerge(raw); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: model.merges[%d]: %w", path, i, err)
		}
	}
	switch {
	case t.byteLevel:
		pre, ignore, err := ggufPreName(&f)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
		}
		add("tokenizer.ggml.model", gguf.StringValue("gpt2"))
		add("tokenizer.ggml.pre", gguf.StringValue(pre))
		add("tokenizer.ggml.tokens", gguf.ArrayValue(tokens))
		add("tokenizer.ggml.token_type", gguf.ArrayValue(types))
		ms := make([]string, len(merges))
		for i, m := range merges {
			ms[i] = m[0] + " " + m[1]
		}
		add("tokenizer.ggml.merges", gguf.ArrayValue(ms))
		if ignore != ggufPres[pre].ignoreMerges {
			add(ignoreMergesKey, gguf.BoolValue(ignore))
		}
	default:
		prefix, err := spmStyle(&f)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
		}
		scores := make([]float32, vocab)
		for i, s := range tokens {
			if _, isByte := parseByteToken(s); isByte && types[i] == ggufTokenNormal {
				types[i] = ggufTokenByte
			} else if len([]rune(s)) > 1 && types[i] == ggufTokenNormal {
				scores[i] = -1e9
			}
		}
		done := make([]bool, vocab)
		for r, m := range merges {
			if id, ok := t.vocab[m[0]+m[1]]; ok && int(id) < vocab && !done[id] {
				scores[id], done[id] = -float32(r), true
			}
		}
		if f.Model.UnkToken != nil {
			if id, ok := t.vocab[*f.Model.UnkToken]; ok {
				types[id] = ggufTokenUnknown
				add("tokenizer.ggml.unknown_token_id", gguf.Uint32Value(uint32(id)))
			}
		}
		add("tokenizer.ggml.model", gguf.StringValue("llama"))
		add("tokenizer.ggml.tokens", gguf.ArrayValue(tokens))
		add("tokenizer.ggml.scores", gguf.ArrayValue(scores))
		add("tokenizer.ggml.token_type", gguf.ArrayValue(types))
		add("tokenizer.ggml.add_space_prefix", gguf.BoolValue(prefix))
	}
	if bos, ok := t.BOS(); ok {
		add("tokenizer.ggml.bos_token_id", gguf.Uint32Value(uint32(bos)))
	}
	for i, key := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		if i < len(t.eos) {
			add(key, gguf.Uint32Value(uint32(t.eos[i])))
		}
	}
	addBOS := len(t.template) > 0 && !t.template[0].seq
	addEOS := len(t.template) > 1 && !t.template[len(t.template)-1].seq
	add("tokenizer.ggml.add_bos_token", gguf.BoolValue(addBOS))
	add("tokenizer.ggml.add_eos_token", gguf.BoolValue(addEOS))
	tmpl, err := chatTemplateSource(dir)
	if err != nil {
		return nil, err
	}
	if tmpl != "" {
		add("tokenizer.chat_template", gguf.StringValue(tmpl))
	}
	return kv, nil
}

// tokenAt returns the token string of id ("" for an id with none).
func (t *Tokenizer) tokenAt(id int) string {
	if id < len(t.tokens) {
		return t.tokens[id]
	}
	return ""
}

// chatTemplateSource reads the chat template as Load finds it.
func chatTemplateSource(dir string) (string, error) {
	var cfg configJSON
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if err := readJSON(cfgPath, &cfg); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	tmpl, err := chatTemplateFromJSON(cfg.ChatTemplate)
	if err != nil {
		return "", fmt.Errorf("%s: %w", cfgPath, err)
	}
	if tmpl != "" {
		return tmpl, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read chat template: %w", err)
	}
	return string(b), nil
}

// ggufPreName names a byte-level tokenizer's pre-tokenizer as llama.cpp
// does, and returns its ignore_merges.
func ggufPreName(f *fileJSON) (string, bool, error) {
	nfc := false
	if n := f.Normalizer; n != nil {
		if n.Type != "NFC" {
			return "", false, fmt.Errorf("normalizer %s cannot be written to GGUF (only Qwen2's NFC is implied by a pre-tokenizer name)", describe(n))
		}
		nfc = true
	}
	name := ""
	p := f.PreTokenizer
	parts := []*componentJSON{p}
	if p != nil && p.Type == "Sequence" {
		parts = p.Pretokenizers
	}
	isByteLevel := func(c *componentJSON, regex bool) bool {
		return c != nil && c.Type == "ByteLevel" && (c.AddPrefixSpace == nil || !*c.AddPrefixSpace) &&
			(c.UseRegex == nil || *c.UseRegex) == regex
	}
	switch {
	case len(parts) == 1 && isByteLevel(parts[0], true):
		name = "gpt-2"
	case len(parts) == 2 && parts[0] != nil && parts[0].Type == "Digits" && parts[0].IndividualDigits && isByteLevel(parts[1], true):
		name = "smollm"
	case len(parts) == 2 && parts[0] != nil && parts[0].Type == "Split" && parts[0].Behavior == "Isolated" && !parts[0].Invert &&
		parts[0].Pattern != nil && parts[0].Pattern.Regex != nil && isByteLevel(parts[1], false):
		switch *parts[0].Pattern.Regex {
		case llama3Pattern:
			name = "llama-bpe"
		case qwen2Pattern:
			name = "qwen2"
		}
	}
	if name == "" {
		return "", false, fmt.Errorf("pre_tokenizer %s has no tokenizer.ggml.pre name (known: the Llama 3 and Qwen2 Split regexes, GPT-2's ByteLevel, SmolLM's Digits + ByteLevel)", describe(p))
	}
	if nfc != ggufPres[name].nfc {
		return "", false, fmt.Errorf("pre-tokenizer %s with normalizer %s cannot be written to GGUF", name, describe(f.Normalizer))
	}
	return name, f.Model.IgnoreMerges, nil
}

// spmStyle checks that a non-byte-level tokenizer is SentencePiece-style
// (what GGUF's "llama" model does) and reports whether it prepends "▁".
func spmStyle(f *fileJSON) (bool, error) {
	isReplace := func(c *componentJSON) bool {
		return c != nil && c.Type == "Replace" && c.Pattern != nil && c.Pattern.String != nil && *c.Pattern.String == " " && c.Content == "▁"
	}
	n, p := f.Normalizer, f.PreTokenizer
	// Gemma's Split on " " (merged with the previous piece) follows a
	// normalizer that has replaced every space: it splits nothing.
	noopSplit := p != nil && p.Type == "Split" && p.Pattern != nil && p.Pattern.String != nil && *p.Pattern.String == " " &&
		p.Behavior == "MergedWithPrevious" && !p.Invert
	switch {
	case (p == nil || noopSplit) && isReplace(n):
		return false, nil
	case p == nil && n != nil && n.Type == "Sequence" && len(n.Normalizers) == 2 &&
		n.Normalizers[0] != nil && n.Normalizers[0].Type == "Prepend" && n.Normalizers[0].Prepend == "▁" && isReplace(n.Normalizers[1]):
		return true, nil
	case n == nil && p != nil && p.Type == "Metaspace" && (p.Replacement == "" || p.Replacement == "▁") && p.Split != nil && !*p.Split &&
		slices.Contains([]string{"always", "first", "never"}, p.PrependScheme):
		return p.PrependScheme != "never", nil
	}
	return false, fmt.Errorf("normalizer %s with pre_tokenizer %s is neither byte-level BPE nor SentencePiece-style, and cannot be written to GGUF", describe(n), describe(p))
}

// describe names a component for messages.
func describe(c *componentJSON) string {
	if c == nil {
		return "none"
	}
	if c.Type != "Sequence" {
		return c.Type
	}
	var parts []*componentJSON
	parts = append(parts, c.Normalizers...)
	parts = append(parts, c.Pretokenizers...)
	s := "Sequence["
	for i, p := range parts {
		if i > 0 {
			s += ", "
		}
		s += describe(p)
	}
	return s + "]"
}
