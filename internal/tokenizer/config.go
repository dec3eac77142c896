package tokenizer

import (
	"encoding/json"
	"fmt"
)

// fileJSON is the subset of Hugging Face's tokenizer.json that Load reads.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    *componentJSON   `json:"normalizer"`
	PreTokenizer  *componentJSON   `json:"pre_tokenizer"`
	PostProcessor *componentJSON   `json:"post_processor"`
	Decoder       *componentJSON   `json:"decoder"`
	Model         modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int32  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Dropout                 *float64          `json:"dropout"`
}

// componentJSON holds the fields of every normalizer, pre-tokenizer,
// post-processor and decoder type Load understands; each type reads the ones
// it needs.
type componentJSON struct {
	Type string `json:"type"`

	// Sequence members.
	Normalizers   []*componentJSON `json:"normalizers"`
	Pretokenizers []*componentJSON `json:"pretokenizers"`
	Processors    []*componentJSON `json:"processors"`
	Decoders      []*componentJSON `json:"decoders"`

	// Replace, Prepend, Split, Strip (decoder).
	Pattern  *patternJSON `json:"pattern"`
	Content  string       `json:"content"`
	Prepend  string       `json:"prepend"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`
	Start    int          `json:"start"`
	Stop     int          `json:"stop"`

	// Strip (normalizer).
	StripLeft  bool `json:"strip_left"`
	StripRight bool `json:"strip_right"`

	// ByteLevel and Metaspace.
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
	Replacement    string `json:"replacement"`
	PrependScheme  string `json:"prepend_scheme"`
	Split          *bool  `json:"split"`

	// Digits.
	IndividualDigits bool `json:"individual_digits"`

	// TemplateProcessing.
	Single        []templateItemJSON             `json:"single"`
	SpecialTokens map[string]templateSpecialJSON `json:"special_tokens"`

	// BertProcessing and RobertaProcessing: [token, id].
	Cls []json.RawMessage `json:"cls"`
	Sep []json.RawMessage `json:"sep"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templateItemJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type templateSpecialJSON struct {
	ID  string  `json:"id"`
	IDs []int32 `json:"ids"`
}

// configJSON is the subset of tokenizer_config.json that Load reads.
type configJSON struct {
	BOSToken     tokenString     `json:"bos_token"`
	EOSToken     tokenString     `json:"eos_token"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// tokenString reads a special token written either as a plain string or as
// an AddedToken object {"content": ...}.
type tokenString struct {
	Set     bool
	Content string
}

func (s *tokenString) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = tokenString{}
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = tokenString{Set: true, Content: str}
		return nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(b, &obj); err != nil || obj.Content == nil {
		return fmt.Errorf("special token %s is neither a string nor an object with \"content\"", truncate(string(b), 80))
	}
	*s = tokenString{Set: true, Content: *obj.Content}
	return nil
}

// chatTemplates parses chat_template, a string or a list of {name, template},
// and returns the default template ("" if none).
func chatTemplateFromJSON(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("chat_template is neither a string nor a list of {name, template}: %w", err)
	}
	for _, t := range list {
		if t.Name == "default" {
			return t.Template, nil
		}
	}
	if len(list) > 0 {
		return list[0].Template, nil
	}
	return "", nil
}

// parseMerge reads one merge written as "a b" or ["a", "b"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		for i := 0; i < len(s); i++ {
			if s[i] == ' ' {
				return s[:i], s[i+1:], nil
			}
		}
		return "", "", fmt.Errorf("merge %q has no space between its two parts", s)
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("merge %s is neither \"a b\" nor [\"a\", \"b\"]", truncate(string(raw), 80))
	}
	return pair[0], pair[1], nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
