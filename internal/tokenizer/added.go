package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	content    string
	pattern    string // what is matched: content, normalized if the token is
	id         int32
	special    bool
	lstrip     bool
	rstrip     bool
	singleWord bool
}

// segment is a span of input: literal text to tokenize (id < 0) or one
// matched added token.
type segment struct {
	text   string
	id     int32
	offset int // byte offset of text in the string that was split
}

// matcher finds added tokens in text, leftmost first and longest among those
// starting at the same place, as the reference's Aho-Corasick matcher with
// MatchKind::LeftmostLongest does.
type matcher struct {
	byFirst [256][]*addedToken // candidates by first byte, longest first
}

func newMatcher(tokens []*addedToken) *matcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &matcher{}
	for _, t := range tokens {
		if t.pattern == "" {
			continue
		}
		m.byFirst[t.pattern[0]] = append(m.byFirst[t.pattern[0]], t)
	}
	for i := range m.byFirst {
		c := m.byFirst[i]
		sort.SliceStable(c, func(a, b int) bool { return len(c[a].pattern) > len(c[b].pattern) })
	}
	return m
}

// split cuts s into text segments and added-token segments. Whitespace taken
// by an lstrip/rstrip token disappears from the neighbouring text.
func (m *matcher) split(s string, dst []segment) []segment {
	if m == nil {
		if s != "" {
			dst = append(dst, segment{text: s, id: -1})
		}
		return dst
	}
	textStart := 0
	for i := 0; i < len(s); {
		var tok *addedToken
		for _, t := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], t.pattern) {
				tok = t
				break
			}
		}
		if tok == nil {
			i++
			continue
		}
		start, end := i, i+len(tok.pattern)
		if tok.singleWord && (endsWithWordChar(s[:start]) || startsWithWordChar(s[end:])) {
			i = end
			continue
		}
		if tok.lstrip {
			start = textStart + len(strings.TrimRightFunc(s[textStart:start], isSpace))
		}
		if tok.rstrip {
			end = len(s) - len(strings.TrimLeftFunc(s[end:], isSpace))
		}
		if start > textStart {
			dst = append(dst, segment{text: s[textStart:start], id: -1, offset: textStart})
		}
		dst = append(dst, segment{text: s[start:end], id: tok.id, offset: start})
		textStart, i = end, end
	}
	if textStart < len(s) {
		dst = append(dst, segment{text: s[textStart:], id: -1, offset: textStart})
	}
	return dst
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func endsWithWordChar(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}
