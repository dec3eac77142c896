package tokenizer

import (
	"fmt"
	"strings"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a span of input text before pre-tokenization.
type normalizer func(string) string

func newNormalizer(c *componentJSON) (normalizer, error) {
	if c == nil {
		return nil, nil
	}
	switch c.Type {
	case "Sequence":
		var parts []normalizer
		for i, sub := range c.Normalizers {
			n, err := newNormalizer(sub)
			if err != nil {
				return nil, fmt.Errorf("sequence item %d: %w", i, err)
			}
			if n != nil {
				parts = append(parts, n)
			}
		}
		return func(s string) string {
			for _, n := range parts {
				s = n(s)
			}
			return s
		}, nil
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Strip":
		left, right := c.StripLeft, c.StripRight
		return func(s string) string {
			if left {
				s = strings.TrimLeftFunc(s, isSpace)
			}
			if right {
				s = strings.TrimRightFunc(s, isSpace)
			}
			return s
		}, nil
	case "Prepend":
		p := c.Prepend
		return func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}, nil
	case "Replace":
		return newReplacer(c)
	default:
		return nil, fmt.Errorf("normalizer type %q is not supported", c.Type)
	}
}

// newReplacer builds the Replace normalizer (also used as a decoder): every
// match of the pattern becomes content.
func newReplacer(c *componentJSON) (func(string) string, error) {
	if c.Pattern == nil {
		return nil, fmt.Errorf("the Replace component has no pattern")
	}
	content := c.Content
	switch {
	case c.Pattern.String != nil:
		old := *c.Pattern.String
		if old == "" {
			return func(s string) string { return s }, nil
		}
		return func(s string) string { return strings.ReplaceAll(s, old, content) }, nil
	case c.Pattern.Regex != nil:
		re, err := compileRegex(*c.Pattern.Regex)
		if err != nil {
			return nil, fmt.Errorf("the Replace component: %w", err)
		}
		return func(s string) string {
			var b strings.Builder
			last := 0
			for _, m := range findAll(re, s) {
				b.WriteString(s[last:m[0]])
				b.WriteString(content)
				last = m[1]
			}
			if last == 0 {
				return s
			}
			b.WriteString(s[last:])
			return b.String()
		}, nil
	default:
		return nil, fmt.Errorf("the Replace component pattern has neither String nor Regex")
	}
}

// compileRegex compiles a tokenizer.json regex. Hugging Face uses Oniguruma,
// whose Perl-style syntax (lookahead, (?i:...), \p{L}) Go's regexp lacks;
// regexp2 accepts it with the same leftmost-first backtracking semantics.
func compileRegex(expr string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", truncate(expr, 120), err)
	}
	return re, nil
}

// findAll returns the byte ranges of all non-empty matches of re in s.
// regexp2 only fails on timeouts, which are not configured here, so an error
// is treated as "no further matches" rather than a reason to panic.
func findAll(re *regexp2.Regexp, s string) [][]int {
	ms, err := re.FindAllStringIndex(s, -1)
	if err != nil {
		return nil
	}
	out := ms[:0]
	for _, m := range ms {
		if m[1] > m[0] {
			out = append(out, m)
		}
	}
	return out
}

// isSpace reports whether r is Unicode White_Space, as Rust's
// char::is_whitespace (used by the reference for lstrip/rstrip) defines it.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}
