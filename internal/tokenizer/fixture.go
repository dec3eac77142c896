package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// llama3Pattern is Llama 3's pre-tokenization regex, used by the tokenizers
// WriteFixture makes.
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// chatMLTemplate is the ChatML chat template (as used by Qwen2 and SmolLM2)
// that WriteFixture stores when asked for one.
const chatMLTemplate = `{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ message.content | trim }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}`

// fixtureSpecials are the special tokens of a fixture tokenizer, in id order
// after the learned vocabulary.
var fixtureSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// maxFixtureMerges caps the merges WriteFixture learns; more would only slow
// it down, as the embedded corpus is small.
const maxFixtureMerges = 1000

// FixtureOptions configures WriteFixture.
type FixtureOptions struct {
	// VocabSize is the model's vocabulary size, which the tokenizer fills:
	// byte tokens, learned merges, synthetic filler words up to VocabSize−3
	// (so that every id a random-weight model can generate decodes to
	// text, as in a real tokenizer), then the 3 special tokens. It must
	// leave room for the 256 byte tokens and the special tokens.
	VocabSize int
	// ChatTemplate adds a ChatML chat template to tokenizer_config.json.
	ChatTemplate bool
}

// Fixture describes a tokenizer written by WriteFixture.
type Fixture struct {
	// BOS is the id of "<|endoftext|>", which doubles as beginning of text.
	// The tokenizer does not add it on Encode, like Qwen2's.
	BOS int32
	// EOS is the id that ends generation: "<|im_end|>" with a chat
	// template, "<|endoftext|>" without.
	EOS int32
	// VocabSize is the number of ids the tokenizer uses
	// (FixtureOptions.VocabSize).
	VocabSize int
}

// WriteFixture writes dir/tokenizer.json and dir/tokenizer_config.json for a
// small, working byte-level BPE tokenizer in the Llama 3 style, so that
// random-weight test models can serve real text. The merges are learned from
// an embedded English corpus when it is called; the output is the same on
// every call with the same options.
func WriteFixture(dir string, opts FixtureOptions) (Fixture, error) {
	minSize := 256 + len(fixtureSpecials)
	if opts.VocabSize < minSize {
		return Fixture{}, fmt.Errorf("fixture tokenizer needs a vocabulary of at least %d (256 bytes + %d special tokens), got %d: use a larger vocab size", minSize, len(fixtureSpecials), opts.VocabSize)
	}
	vocab, merges, err := trainBPE(fixtureCorpus, min(opts.VocabSize-minSize, maxFixtureMerges))
	if err != nil {
		return Fixture{}, err
	}
	vocab = padVocab(vocab, opts.VocabSize-len(fixtureSpecials))
	first := int32(len(vocab))
	var added []addedTokenJSON
	for i, s := range fixtureSpecials {
		added = append(added, addedTokenJSON{ID: first + int32(i), Content: s, Special: true})
	}
	fx := Fixture{BOS: first, EOS: first, VocabSize: len(vocab) + len(fixtureSpecials)}
	cfg := map[string]any{
		"add_bos_token":                false,
		"add_eos_token":                false,
		"bos_token":                    fixtureSpecials[0],
		"eos_token":                    fixtureSpecials[0],
		"clean_up_tokenization_spaces": false,
		"model_max_length":             131072,
		"tokenizer_class":              "PreTrainedTokenizerFast",
	}
	if opts.ChatTemplate {
		fx.EOS = first + 2
		cfg["eos_token"] = fixtureSpecials[2]
		cfg["chat_template"] = chatMLTemplate
	}
	tok := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": orderedVocab(vocab), "merges": merges,
		},
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Fixture{}, fmt.Errorf("create fixture tokenizer directory: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "tokenizer.json"), tok); err != nil {
		return Fixture{}, err
	}
	if err := writeJSON(filepath.Join(dir, "tokenizer_config.json"), cfg); err != nil {
		return Fixture{}, err
	}
	return fx, nil
}

func writeJSON(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write fixture tokenizer: %w", err)
	}
	return nil
}

// orderedVocab is a vocabulary (token strings indexed by id) that marshals
// as a JSON object in id order, which keeps written files readable.
type orderedVocab []string

func (v orderedVocab) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for id, s := range v {
		if id > 0 {
			buf.WriteByte(',')
		}
		k, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		buf.Write(k)
		buf.WriteByte(':')
		buf.WriteString(strconv.Itoa(id))
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// trainBPE learns up to maxMerges byte-level BPE merges from corpus: the most
// frequent adjacent pair is merged first, ties going to the pair that sorts
// first. Pairs seen only once still merge (the corpus is small, and whole
// rare words as tokens are harmless in a fixture); training stops early only
// when every word is a single token. It returns the
// vocabulary by id (the 256 byte symbols first) and the merges in order.
func trainBPE(corpus string, maxMerges int) ([]string, [][2]string, error) {
	re, err := compileRegex(llama3Pattern)
	if err != nil {
		return nil, nil, err
	}
	counts := map[string]int{}
	for _, m := range findAll(re, corpus) {
		counts[byteLevelString(corpus[m[0]:m[1]])]++
	}
	type word struct {
		syms []string
		n    int
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	words := make([]word, len(keys))
	for i, k := range keys {
		var syms []string
		for _, r := range k {
			syms = append(syms, string(r))
		}
		words[i] = word{syms: syms, n: counts[k]}
	}

	vocab := make([]string, 256, 256+maxMerges)
	known := make(map[string]bool, 256+maxMerges)
	for b := range 256 {
		vocab[b] = string(byteToRune[b])
		known[vocab[b]] = true
	}
	var merges [][2]string
	for len(merges) < maxMerges {
		pairs := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[[2]string{w.syms[i], w.syms[i+1]}] += w.n
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range pairs {
			if n > bestN || n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, n
			}
		}
		if bestN == 0 {
			break
		}
		merged := best[0] + best[1]
		merges = append(merges, best)
		if !known[merged] {
			known[merged] = true
			vocab = append(vocab, merged)
		}
		for wi := range words {
			s := words[wi].syms
			out := s[:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, merged)
					i++
				} else {
					out = append(out, s[i])
				}
			}
			words[wi].syms = out
		}
	}
	return vocab, merges, nil
}

// fillerSyllables build the synthetic words padVocab appends.
var fillerSyllables = []string{"ba", "ke", "lo", "mi", "nu", "ra", "se", "ti", "vo", "za", "do", "fu", "ga", "he", "ji", "pe"}

// padVocab appends synthetic words (" bake", " lomi", ...) to vocab until it
// has n entries. No merge produces them, so Encode never emits them, but
// every id decodes to readable text — a random-weight model samples ids
// across its whole vocabulary, and a real tokenizer covers all of them.
func padVocab(vocab []string, n int) []string {
	seen := make(map[string]bool, n)
	for _, v := range vocab {
		seen[v] = true
	}
	for i := 0; len(vocab) < n; i++ {
		w := "Ġ" // the byte-level symbol for a leading space
		for k := i; ; k /= len(fillerSyllables) {
			w += fillerSyllables[k%len(fillerSyllables)]
			if k < len(fillerSyllables) {
				break
			}
		}
		if !seen[w] {
			seen[w] = true
			vocab = append(vocab, w)
		}
	}
	return vocab
}
