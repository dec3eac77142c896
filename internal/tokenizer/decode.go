package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text, one step of tokenizer.json's
// decoder chain. In raw mode bytes are kept as they are (possibly invalid
// UTF-8) and steps that only tidy the start of a whole text (Strip, the
// Metaspace first-token rule) are skipped; TokenText uses it to show one
// token on its own.
type decoder func(tokens []string, raw bool) []string

func newDecoder(c *componentJSON) (decoder, error) {
	if c == nil {
		return nil, nil
	}
	switch c.Type {
	case "Sequence":
		var parts []decoder
		for i, sub := range c.Decoders {
			d, err := newDecoder(sub)
			if err != nil {
				return nil, fmt.Errorf("sequence item %d: %w", i, err)
			}
			if d != nil {
				parts = append(parts, d)
			}
		}
		return func(tokens []string, raw bool) []string {
			for _, d := range parts {
				tokens = d(tokens, raw)
			}
			return tokens
		}, nil
	case "ByteLevel":
		return func(tokens []string, raw bool) []string {
			var b []byte
			for _, t := range tokens {
				b = byteLevelBytes(t, b)
			}
			if raw {
				return []string{string(b)}
			}
			return []string{lossyUTF8(b)}
		}, nil
	case "Replace":
		r, err := newReplacer(c)
		if err != nil {
			return nil, err
		}
		return func(tokens []string, _ bool) []string {
			for i, t := range tokens {
				tokens[i] = r(t)
			}
			return tokens
		}, nil
	case "ByteFallback":
		return byteFallback, nil
	case "Fuse":
		return func(tokens []string, _ bool) []string {
			if len(tokens) <= 1 {
				return tokens
			}
			return []string{strings.Join(tokens, "")}
		}, nil
	case "Strip":
		content, start, stop := c.Content, c.Start, c.Stop
		if utf8.RuneCountInString(content) != 1 {
			return nil, fmt.Errorf("the Strip component content %q must be one character", content)
		}
		return func(tokens []string, raw bool) []string {
			if raw {
				return tokens
			}
			for i, t := range tokens {
				for n := 0; n < start && strings.HasPrefix(t, content); n++ {
					t = t[len(content):]
				}
				for n := 0; n < stop && strings.HasSuffix(t, content); n++ {
					t = t[:len(t)-len(content)]
				}
				tokens[i] = t
			}
			return tokens
		}, nil
	case "Metaspace":
		repl := c.Replacement
		if repl == "" {
			repl = "▁"
		}
		stripFirst := c.PrependScheme != "never" && (c.PrependScheme != "" || c.AddPrefixSpace == nil || *c.AddPrefixSpace)
		return func(tokens []string, raw bool) []string {
			for i, t := range tokens {
				if i == 0 && stripFirst && !raw {
					tokens[i] = strings.ReplaceAll(t, repl, "")
				} else {
					tokens[i] = strings.ReplaceAll(t, repl, " ")
				}
			}
			return tokens
		}, nil
	default:
		return nil, fmt.Errorf("decoder type %q is not supported", c.Type)
	}
}

// byteFallback turns runs of <0xHH> tokens into the text their bytes spell.
// A run that is not valid UTF-8 becomes one U+FFFD per byte, as in the
// reference; in raw mode the bytes are kept.
func byteFallback(tokens []string, raw bool) []string {
	out := tokens[:0:0]
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		switch {
		case raw || utf8.Valid(run):
			out = append(out, string(run))
		default:
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// parseByteToken reads a byte-fallback token "<0xHH>".
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(t[3])
	lo, ok2 := unhex(t[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// lossyUTF8 converts b to a string, replacing each maximal invalid
// subsequence with one U+FFFD, like Rust's String::from_utf8_lossy (and so
// the reference); Go's own conversions differ by replacing byte by byte or
// run by run.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			sb.Write(b[i : i+n])
			i += n
			continue
		}
		sb.WriteString("\uFFFD")
		i += maximalSubpart(b[i:])
	}
	return sb.String()
}

// maximalSubpart returns the length of the longest prefix of b (which starts
// with an invalid sequence) that is a prefix of some valid UTF-8 sequence,
// at least 1.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c == 0xED:
		need, hi = 2, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		need, lo = 3, 0x90
	case c == 0xF4:
		need, hi = 3, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(b); n++ {
		if b[n] < lo || b[n] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return n
}

// Decode returns the text of ids. With skipSpecial, special tokens (BOS, EOS,
// chat markers) are left out. Ids outside the vocabulary are ignored, as in
// the reference. Bytes that do not form valid UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.tokens) || (skipSpecial && t.special[id]) {
			continue
		}
		if s := t.tokens[id]; s != "" {
			tokens = append(tokens, s)
		}
	}
	return t.decodeTokens(tokens, false)
}

func (t *Tokenizer) decodeTokens(tokens []string, raw bool) string {
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder(tokens, raw), "")
}

// TokenText returns how one token reads in OpenAI-style logprobs: its own
// decoded text, keeping a SentencePiece token's leading space (" the", not
// "the") so that concatenated tokens spell the text. A token whose bytes are
// not valid UTF-8 on their own, such as half of a multi-byte character, is
// shown as "bytes:" followed by \xHH escapes, the convention OpenAI's API
// uses. Unknown ids give "".
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" {
		return ""
	}
	s := t.decodeTokens([]string{t.tokens[id]}, true)
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.WriteString("bytes:")
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\x%02x`, s[i])
	}
	return b.String()
}
