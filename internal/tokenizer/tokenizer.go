package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// Tokenizer encodes text to token ids and decodes ids to text for one model.
// It is immutable after Load and safe for concurrent use.
type Tokenizer struct {
	model     wordModel
	normalize normalizer
	preTok    preTokenizer
	rawMatch  *matcher // added tokens matched in the raw text
	normMatch *matcher // added tokens matched after normalization
	template  []templateItem
	decoder   decoder
	tokens    []string // id → token string; "" where no token has the id
	special   []bool   // id → is a special added token
	vocab     map[string]int32
	added     map[string]int32 // added token content → id
	bos       int32
	hasBOS    bool
	eos       []int32
	bosToken  string
	eosToken  string
	chat      *chatTemplate
	byteLevel bool // the decoder is ByteLevel, so every string round-trips
}

// templateItem is one element of the single-sequence post-processing
// template: fixed ids, or (seq) the encoded text itself.
type templateItem struct {
	ids []int32
	seq bool
}

// Load reads dir/tokenizer.json and, where present, dir/tokenizer_config.json
// (special tokens, add_bos_token, add_eos_token, chat_template),
// dir/chat_template.jinja and dir/generation_config.json (eos_token_id).
// dir may instead be a GGUF file (see LoadGGUF).
func Load(dir string) (*Tokenizer, error) {
	if gguf.IsFile(dir) {
		return LoadGGUF(dir)
	}
	t, err := LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	var cfg configJSON
	if err := readJSON(cfgPath, &cfg); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := t.applyConfig(&cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	tmpl, err := chatTemplateFromJSON(cfg.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	if tmpl == "" {
		b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read chat template: %w", err)
		}
		tmpl = string(b)
	}
	if tmpl != "" {
		t.chat = newChatTemplate(tmpl)
	}
	var gen struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	genPath := filepath.Join(dir, "generation_config.json")
	if err := readJSON(genPath, &gen); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if len(gen.EOS) > 0 {
		ids, err := parseIDs(gen.EOS)
		if err != nil {
			return nil, fmt.Errorf("%s: eos_token_id: %w", genPath, err)
		}
		for _, id := range ids {
			t.addEOS(id)
		}
	}
	return t, nil
}

// LoadFile reads a bare tokenizer.json. Without tokenizer_config.json the
// special tokens come from the post-processor: BOS is the first special token
// the template puts before the text; there is no EOS and no chat template.
func LoadFile(path string) (*Tokenizer, error) {
	var f fileJSON
	if err := readJSON(path, &f); err != nil {
		return nil, err
	}
	t, err := build(&f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read tokenizer file: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s (is it a Hugging Face tokenizer file?): %w", path, err)
	}
	return nil
}

func build(f *fileJSON) (*Tokenizer, error) {
	model, err := newBPE(&f.Model)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: model, vocab: f.Model.Vocab, bos: -1}
	if t.normalize, err = newNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.preTok, err = newPreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if t.decoder, err = newDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	t.byteLevel = f.Decoder != nil && f.Decoder.Type == "ByteLevel"

	size := int32(0)
	for _, id := range f.Model.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab has negative id %d", id)
		}
		size = max(size, id+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("added token %q has negative id %d", a.Content, a.ID)
		}
		size = max(size, a.ID+1)
	}
	t.tokens = make([]string, size)
	t.special = make([]bool, size)
	for s, id := range f.Model.Vocab {
		t.tokens[id] = s
	}
	var raw, normed []*addedToken
	t.added = make(map[string]int32, len(f.AddedTokens))
	for _, a := range f.AddedTokens {
		t.added[a.Content] = a.ID
		t.tokens[a.ID] = a.Content
		t.special[a.ID] = a.Special
		tok := &addedToken{content: a.Content, pattern: a.Content, id: a.ID, special: a.Special,
			lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord}
		if a.Normalized && !a.Special {
			if t.normalize != nil {
				tok.pattern = t.normalize(tok.pattern)
			}
			normed = append(normed, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.rawMatch, t.normMatch = newMatcher(raw), newMatcher(normed)

	if t.template, err = newPostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if len(t.template) > 0 && !t.template[0].seq && len(t.template[0].ids) > 0 {
		t.bos, t.hasBOS = t.template[0].ids[0], true
	}
	return t, nil
}

// applyConfig applies tokenizer_config.json: named BOS/EOS tokens and, when
// add_bos_token or add_eos_token is given, a template built from them, as
// transformers' Llama-family tokenizers do.
func (t *Tokenizer) applyConfig(c *configJSON) error {
	if c.BOSToken.Set {
		id, ok := t.TokenID(c.BOSToken.Content)
		if !ok {
			return fmt.Errorf("bos_token %q is not in the vocabulary", c.BOSToken.Content)
		}
		t.bos, t.hasBOS, t.bosToken = id, true, c.BOSToken.Content
		t.special[id] = true // transformers skips every named special token
	}
	if c.EOSToken.Set {
		id, ok := t.TokenID(c.EOSToken.Content)
		if !ok {
			return fmt.Errorf("eos_token %q is not in the vocabulary", c.EOSToken.Content)
		}
		t.eosToken = c.EOSToken.Content
		t.special[id] = true
		t.addEOS(id)
	}
	if c.AddBOSToken == nil && c.AddEOSToken == nil {
		return nil
	}
	var tmpl []templateItem
	if c.AddBOSToken != nil && *c.AddBOSToken {
		if !t.hasBOS {
			return fmt.Errorf("add_bos_token is true but no bos_token is set")
		}
		tmpl = append(tmpl, templateItem{ids: []int32{t.bos}})
	}
	tmpl = append(tmpl, templateItem{seq: true})
	if c.AddEOSToken != nil && *c.AddEOSToken {
		if len(t.eos) == 0 {
			return fmt.Errorf("add_eos_token is true but no eos_token is set")
		}
		tmpl = append(tmpl, templateItem{ids: []int32{t.eos[0]}})
	}
	t.template = tmpl
	return nil
}

func (t *Tokenizer) addEOS(id int32) {
	if slices.Contains(t.eos, id) {
		return
	}
	t.eos = append(t.eos, id)
}

func parseIDs(raw json.RawMessage) ([]int32, error) {
	raw = bytes.TrimSpace(raw)
	if string(raw) == "null" {
		return nil, nil
	}
	var one int32
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int32{one}, nil
	}
	var many []int32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want an id or a list of ids, got %s", truncate(string(raw), 80))
	}
	return many, nil
}

func newPostProcessor(c *componentJSON) ([]templateItem, error) {
	if c == nil {
		return nil, nil
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil // only adjusts offsets
	case "Sequence":
		var out []templateItem
		for i, sub := range c.Processors {
			items, err := newPostProcessor(sub)
			if err != nil {
				return nil, fmt.Errorf("sequence item %d: %w", i, err)
			}
			if items != nil {
				if out != nil {
					return nil, fmt.Errorf("the Sequence component has more than one processor that adds tokens")
				}
				out = items
			}
		}
		return out, nil
	case "TemplateProcessing":
		var out []templateItem
		for i, it := range c.Single {
			switch {
			case it.Sequence != nil:
				if it.Sequence.ID != "A" {
					return nil, fmt.Errorf("single[%d] refers to sequence %q; only A exists for one input", i, it.Sequence.ID)
				}
				out = append(out, templateItem{seq: true})
			case it.SpecialToken != nil:
				sp, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("single[%d] uses special token %q missing from special_tokens", i, it.SpecialToken.ID)
				}
				out = append(out, templateItem{ids: sp.IDs})
			default:
				return nil, fmt.Errorf("single[%d] is neither Sequence nor SpecialToken", i)
			}
		}
		return out, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenRef(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("%s cls: %w", c.Type, err)
		}
		sep, err := tokenRef(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("%s sep: %w", c.Type, err)
		}
		return []templateItem{{ids: []int32{cls}}, {seq: true}, {ids: []int32{sep}}}, nil
	default:
		return nil, fmt.Errorf("post_processor type %q is not supported", c.Type)
	}
}

// tokenRef reads a ["token", id] pair.
func tokenRef(raw []json.RawMessage) (int32, error) {
	var id int32
	if len(raw) != 2 || json.Unmarshal(raw[1], &id) != nil {
		return 0, fmt.Errorf("want [token, id]")
	}
	return id, nil
}

// Encode returns the ids of text. With addSpecial it also adds the special
// tokens of the post-processor (typically BOS), like Hugging Face's
// add_special_tokens=True. Added and special tokens written literally in the
// text are always recognised. Invalid UTF-8 in text is replaced with U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	ids := make([]int32, 0, len(text)/3+4)
	if !addSpecial || len(t.template) == 0 {
		return t.encode(text, ids, true)
	}
	for _, it := range t.template {
		if it.seq {
			ids = t.encode(text, ids, true)
		} else {
			ids = append(ids, it.ids...)
		}
	}
	return ids
}

// encode appends the ids of text. atStart says text begins the input (for
// pre-tokenizers that treat the input's first piece apart); false only for
// the later chunks of EncodeBounded's estimate.
func (t *Tokenizer) encode(text string, ids []int32, atStart bool) []int32 {
	var segBuf [8]segment
	var pieces []string
	for _, seg := range t.rawMatch.split(text, segBuf[:0]) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		s := seg.text
		if t.normalize != nil {
			s = t.normalize(s)
		}
		var sub [4]segment
		for _, part := range t.normMatch.split(s, sub[:0]) {
			if part.id >= 0 {
				ids = append(ids, part.id)
				continue
			}
			pieces = append(pieces[:0], part.text)
			if t.preTok != nil {
				pieces = t.preTok(pieces, atStart && seg.offset == 0 && part.offset == 0)
			}
			for _, p := range pieces {
				ids = t.model.encode(p, ids)
			}
		}
	}
	return ids
}

// VocabSize returns the number of ids: the largest id, including added
// tokens, plus one.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS returns the beginning-of-sequence id, if the tokenizer has one. Whether
// Encode adds it is decided by the post-processor (see Encode).
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.hasBOS }

// EOS returns the ids that end generation: tokenizer_config.json's eos_token
// followed by any further eos_token_id of generation_config.json.
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

// IsSpecial reports whether id is a special added token (such as BOS, EOS or
// a chat-template marker), which Decode can skip.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// TokenID returns the id of the token spelled exactly s (in the model's own
// alphabet, e.g. "Ġthe" or "▁the"), including added tokens.
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	if id, ok := t.added[s]; ok {
		return id, true
	}
	id, ok := t.vocab[s]
	return id, ok
}
