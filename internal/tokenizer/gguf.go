package tokenizer

import (
	"fmt"
	"strings"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// wordModel maps one pre-tokenized piece of text to ids: the BPE model of
// tokenizer.json (bpe) or a GGUF SentencePiece vocabulary (spm).
type wordModel interface {
	encode(word string, dst []int32) []int32
}

// GGUF token types (tokenizer.ggml.token_type), as llama.cpp defines them.
const (
	ggufTokenNormal      = 1
	ggufTokenUnknown     = 2
	ggufTokenControl     = 3
	ggufTokenUserDefined = 4
	ggufTokenUnused      = 5
	ggufTokenByte        = 6
)

// GGUF pre-tokenizer regexes (tokenizer.ggml.pre), in Hugging Face's
// spelling of the expressions llama.cpp uses (llama-vocab.cpp).
const (
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// The expressions of llama.cpp's "default" pre-tokenizer, applied in
	// turn.
	defaultPunctPattern = `[\p{P}\$\+<=>\^~\|]+`
	defaultGPT2Pattern  = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
)

// ggufPre describes one tokenizer.ggml.pre name: the regexes llama.cpp
// splits with, in turn, and the options the name implies.
type ggufPre struct {
	regexes      []string
	nfc          bool // Qwen2's tokenizer.json normalizes to NFC first
	ignoreMerges bool
	addBOS       bool
}

// ggufPres are the pre-tokenizer names LoadGGUF understands.
var ggufPres = map[string]ggufPre{
	"llama-bpe": {regexes: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
	"llama3":    {regexes: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
	"llama-v3":  {regexes: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
	"qwen2":     {regexes: []string{qwen2Pattern}, nfc: true},
	"gpt-2":     {regexes: []string{gpt2Pattern}},
	"gpt2":      {regexes: []string{gpt2Pattern}},
	"smollm":    {regexes: []string{`\p{N}`, gpt2Pattern}},
	"default":   {regexes: []string{defaultPunctPattern, defaultGPT2Pattern, `\p{N}+`, `[0-9][0-9][0-9]`}},
}

// LoadGGUF reads the tokenizer stored in the metadata of the GGUF file at
// path (see FromGGUF).
func LoadGGUF(path string) (*Tokenizer, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	t, err := FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// FromGGUF builds the tokenizer that llama.cpp's tokenizer.ggml.* metadata
// describes:
//
//   - tokenizer.ggml.model "gpt2": byte-level BPE with tokenizer.ggml.merges,
//     split first by the regexes of tokenizer.ggml.pre (llama-bpe, llama3,
//     llama-v3, qwen2, gpt-2, smollm, default; another name is an error);
//   - "llama": SentencePiece with tokenizer.ggml.scores, merged as llama.cpp
//     does (the adjacent pair whose concatenation is the highest-scoring
//     token first, the leftmost on ties), spaces as "▁" and a leading one
//     unless tokenizer.ggml.add_space_prefix is false, unknown characters as
//     <0xXX> byte tokens.
//
// Tokens of type control (3), user-defined (4) and unknown (2) are matched
// literally in the text (control ones are special: Decode can skip them).
// The special ids come from tokenizer.ggml.{bos,eos,unknown}_token_id (for
// "llama" 1, 2 and 0 by default, as in llama.cpp), the end-of-generation ids
// are the eos, eot and eom ids, add_bos_token and add_eos_token say what
// Encode adds (by default BOS for "llama" and llama-bpe), and
// tokenizer.chat_template is the chat template.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	kind, ok, err := f.Str("tokenizer.ggml.model")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("tokenizer: the GGUF file has no tokenizer (tokenizer.ggml.model is missing)")
	}
	tv, ok := f.Get("tokenizer.ggml.tokens")
	tokens, isStrings := gguf.ArrayOf[string](tv)
	if !ok || !isStrings || len(tokens) == 0 || len(tokens) > 1<<30 {
		return nil, fmt.Errorf("tokenizer: tokenizer.ggml.tokens must be a non-empty array of strings, found %s", tv)
	}
	n := len(tokens)
	types := make([]int32, n)
	for i := range types {
		types[i] = ggufTokenNormal
	}
	if v, ok := f.Get("tokenizer.ggml.token_type"); ok {
		tt, isI32 := gguf.ArrayOf[int32](v)
		if !isI32 || len(tt) != n {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.token_type must be %d int32s, found %s", n, v)
		}
		copy(types, tt)
	}
	k := ggufKeys{f: f, n: n}

	t := &Tokenizer{tokens: append([]string(nil), tokens...), special: make([]bool, n), bos: -1,
		vocab: make(map[string]int32, n), added: map[string]int32{}}
	for i, s := range tokens {
		t.vocab[s] = int32(i) // the last of duplicates wins, as in llama.cpp
	}
	var defBOS, defEOS int32 = -1, -1
	var addBOS bool
	var decoder *componentJSON
	switch kind {
	case "llama":
		defBOS, defEOS, addBOS = 1, 2, true
		decoder, err = t.ggufSPM(k)
	case "gpt2":
		decoder, addBOS, err = t.ggufBPE(k)
	default:
		return nil, fmt.Errorf("tokenizer: tokenizer.ggml.model %q is not supported (supported: llama, gpt2)", kind)
	}
	if err != nil {
		return nil, err
	}
	if t.decoder, err = newDecoder(decoder); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t.ggufLiterals(tokens, types)
	if err := t.ggufSpecials(k, defBOS, defEOS, addBOS); err != nil {
		return nil, err
	}
	tmpl, _, err := f.Str("tokenizer.chat_template")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if tmpl != "" {
		t.chat = newChatTemplate(tmpl)
	}
	return t, nil
}

// ggufKeys reads the scalar tokenizer keys of a GGUF file whose vocabulary
// has n tokens.
type ggufKeys struct {
	f *gguf.File
	n int
}

// id reads a token id, def when the key is absent, -1 when it is past the
// end of the vocabulary.
func (k ggufKeys) id(key string, def int32) (int32, error) {
	v, ok, err := k.f.Uint(key)
	if err != nil {
		return 0, fmt.Errorf("tokenizer: %w", err)
	}
	if !ok {
		return def, nil
	}
	if v >= uint64(k.n) {
		// llama.cpp files mark "none" with an id past the end (e.g.
		// a pad id of -1 written as uint32).
		return -1, nil
	}
	return int32(v), nil
}

// bool reads a boolean, def when the key is absent.
func (k ggufKeys) bool(key string, def bool) (bool, error) {
	b, ok, err := k.f.Bool(key)
	if err != nil {
		return false, fmt.Errorf("tokenizer: %w", err)
	}
	if !ok {
		return def, nil
	}
	return b, nil
}

// ggufSPM sets up a "llama" (SentencePiece) tokenizer: its normalizer and
// merge model; it returns the decoder's description.
func (t *Tokenizer) ggufSPM(k ggufKeys) (*componentJSON, error) {
	prefix, err := k.bool("tokenizer.ggml.add_space_prefix", true)
	if err != nil {
		return nil, err
	}
	norms := []*componentJSON{{Type: "Replace", Pattern: &patternJSON{String: new(" ")}, Content: "▁"}}
	decoders := []*componentJSON{{Type: "Replace", Pattern: &patternJSON{String: new("▁")}, Content: " "}, {Type: "ByteFallback"}, {Type: "Fuse"}}
	if prefix {
		norms = append([]*componentJSON{{Type: "Prepend", Prepend: "▁"}}, norms...)
		decoders = append(decoders, &componentJSON{Type: "Strip", Content: " ", Start: 1})
	}
	if t.normalize, err = newNormalizer(&componentJSON{Type: "Sequence", Normalizers: norms}); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	unk, err := k.id("tokenizer.ggml.unknown_token_id", 0)
	if err != nil {
		return nil, err
	}
	scores := make([]float32, k.n)
	if v, ok := k.f.Get("tokenizer.ggml.scores"); ok {
		sc, isF32 := gguf.ArrayOf[float32](v)
		if !isF32 || len(sc) != k.n {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.scores must be %d float32s, found %s", k.n, v)
		}
		copy(scores, sc)
	}
	t.model = newSPM(t.vocab, scores, unk)
	return &componentJSON{Type: "Sequence", Decoders: decoders}, nil
}

// ggufBPE sets up a "gpt2" (byte-level BPE) tokenizer: its pre-tokenizer,
// normalizer and merges; it returns the decoder's description and whether
// the pre-tokenizer's models add BOS by default.
func (t *Tokenizer) ggufBPE(k ggufKeys) (decoder *componentJSON, addBOS bool, err error) {
	name, _, err := k.f.Str("tokenizer.ggml.pre")
	if err != nil {
		return nil, false, fmt.Errorf("tokenizer: %w", err)
	}
	if name == "" {
		name = "default" // as llama.cpp, which warns that quality suffers
	}
	pre, known := ggufPres[name]
	if !known {
		return nil, false, fmt.Errorf("tokenizer: tokenizer.ggml.pre %q is not a pre-tokenizer Tandem knows (known: default, gpt-2, gpt2, llama-bpe, llama-v3, llama3, qwen2, smollm)", name)
	}
	seq := &componentJSON{Type: "Sequence"}
	for _, re := range pre.regexes {
		seq.Pretokenizers = append(seq.Pretokenizers, &componentJSON{Type: "Split", Pattern: &patternJSON{Regex: new(re)}, Behavior: "Isolated"})
	}
	seq.Pretokenizers = append(seq.Pretokenizers, &componentJSON{Type: "ByteLevel", AddPrefixSpace: new(false), UseRegex: new(false)})
	if t.preTok, err = newPreTokenizer(seq); err != nil {
		return nil, false, fmt.Errorf("tokenizer: %w", err)
	}
	if pre.nfc {
		t.normalize, _ = newNormalizer(&componentJSON{Type: "NFC"})
	}
	t.byteLevel = true
	mv, ok := k.f.Get("tokenizer.ggml.merges")
	merges, isStrings := gguf.ArrayOf[string](mv)
	if !ok || !isStrings {
		return nil, false, fmt.Errorf("tokenizer: a gpt2 tokenizer needs tokenizer.ggml.merges (an array of strings), found %s", mv)
	}
	ignore, err := k.bool(ignoreMergesKey, pre.ignoreMerges)
	if err != nil {
		return nil, false, err
	}
	b := &bpe{vocab: t.vocab, merges: make(map[uint64]merge, len(merges)), unk: -1, ignoreMerges: ignore}
	for i := range b.byteTokens {
		b.byteTokens[i] = -1
	}
	if err := b.addMerges(merges); err != nil {
		return nil, false, err
	}
	t.model = b
	return &componentJSON{Type: "ByteLevel"}, pre.addBOS, nil
}

// ggufLiterals registers the tokens matched literally in the text: those of
// type control, unknown (both special) and user-defined.
func (t *Tokenizer) ggufLiterals(tokens []string, types []int32) {
	var literal []*addedToken
	for i, s := range tokens {
		switch types[i] {
		case ggufTokenControl, ggufTokenUnknown, ggufTokenUserDefined:
			special := types[i] != ggufTokenUserDefined
			t.special[i] = special
			if s == "" {
				continue
			}
			t.added[s] = int32(i)
			literal = append(literal, &addedToken{content: s, pattern: s, id: int32(i), special: special})
		}
	}
	t.rawMatch = newMatcher(literal)
}

// ggufSpecials reads the BOS, EOS and end-of-generation ids (defBOS and
// defEOS where the file names none) and what Encode adds around a text
// (addBOS by default).
func (t *Tokenizer) ggufSpecials(k ggufKeys, defBOS, defEOS int32, addBOS bool) error {
	bos, err := k.id("tokenizer.ggml.bos_token_id", defBOS)
	if err != nil {
		return err
	}
	if bos >= 0 {
		t.bos, t.hasBOS, t.bosToken = bos, true, t.tokens[bos]
		t.special[bos] = true
	}
	eos, err := k.id("tokenizer.ggml.eos_token_id", defEOS)
	if err != nil {
		return err
	}
	if eos >= 0 {
		t.eosToken = t.tokens[eos]
		t.special[eos] = true
		t.addEOS(eos)
	}
	for _, key := range []string{"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		x, err := k.id(key, -1)
		if err != nil {
			return err
		}
		if x >= 0 {
			t.addEOS(x)
		}
	}
	if addBOS, err = k.bool("tokenizer.ggml.add_bos_token", addBOS); err != nil {
		return err
	}
	addEOS, err := k.bool("tokenizer.ggml.add_eos_token", false)
	if err != nil {
		return err
	}
	if addBOS {
		if !t.hasBOS {
			return fmt.Errorf("tokenizer: add_bos_token is true but the file has no bos_token_id")
		}
		t.template = append(t.template, templateItem{ids: []int32{t.bos}})
	}
	t.template = append(t.template, templateItem{seq: true})
	if addEOS {
		if eos < 0 {
			return fmt.Errorf("tokenizer: add_eos_token is true but the file has no eos_token_id")
		}
		t.template = append(t.template, templateItem{ids: []int32{eos}})
	}
	return nil
}

// addMerges adds GGUF merges ("left right", split at the first space after
// the first byte, as llama.cpp does) in priority order.
func (b *bpe) addMerges(merges []string) error {
	for rank, m := range merges {
		i := -1
		if len(m) > 1 {
			i = strings.IndexByte(m[1:], ' ')
		}
		if i < 0 {
			return fmt.Errorf("tokenizer: tokenizer.ggml.merges[%d] %q has no space between its two parts", rank, truncate(m, 80))
		}
		left, right := m[:i+1], m[i+2:]
		a, okA := b.vocab[left]
		c, okC := b.vocab[right]
		id, okM := b.vocab[left+right]
		if !okA || !okC || !okM {
			return fmt.Errorf("tokenizer: tokenizer.ggml.merges[%d] (%q %q) uses or produces a token missing from the vocabulary", rank, left, right)
		}
		if _, dup := b.merges[pairKey(a, c)]; !dup {
			b.merges[pairKey(a, c)] = merge{rank: int32(rank), id: id}
		}
	}
	return nil
}
