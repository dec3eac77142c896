package tokenizer

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/dlclark/regexp2/v2"
)

// gpt2Pattern is the pre-tokenization regex of GPT-2, used by the ByteLevel
// pre-tokenizer when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// preTokenizer splits (and may rewrite) the pieces of a text span. first
// reports whether pieces[0] starts at offset 0 of the original input, which
// Metaspace's "first" prepend scheme needs.
type preTokenizer func(pieces []string, first bool) []string

func newPreTokenizer(c *componentJSON) (preTokenizer, error) {
	if c == nil {
		return nil, nil
	}
	switch c.Type {
	case "Sequence":
		var parts []preTokenizer
		for i, sub := range c.Pretokenizers {
			p, err := newPreTokenizer(sub)
			if err != nil {
				return nil, fmt.Errorf("sequence item %d: %w", i, err)
			}
			if p != nil {
				parts = append(parts, p)
			}
		}
		return func(pieces []string, first bool) []string {
			for _, p := range parts {
				pieces = p(pieces, first)
			}
			return pieces
		}, nil
	case "ByteLevel":
		addPrefix := c.AddPrefixSpace != nil && *c.AddPrefixSpace
		var re *regexp2.Regexp
		if c.UseRegex == nil || *c.UseRegex {
			var err error
			if re, err = compileRegex(gpt2Pattern); err != nil {
				return nil, err
			}
		}
		return func(pieces []string, _ bool) []string {
			out := make([]string, 0, len(pieces))
			for _, p := range pieces {
				if addPrefix && p != "" && p[0] != ' ' {
					p = " " + p
				}
				if re == nil {
					out = append(out, byteLevelString(p))
					continue
				}
				for _, part := range splitRegex(re, p, "Isolated", false) {
					out = append(out, byteLevelString(part))
				}
			}
			return out
		}, nil
	case "Split":
		return newSplit(c)
	case "Metaspace":
		return newMetaspace(c)
	case "Digits":
		individual := c.IndividualDigits
		return func(pieces []string, _ bool) []string {
			var out []string
			for _, p := range pieces {
				out = splitDigits(p, individual, out)
			}
			return out
		}, nil
	case "WhitespaceSplit":
		return func(pieces []string, _ bool) []string {
			var out []string
			for _, p := range pieces {
				out = append(out, strings.FieldsFunc(p, isSpace)...)
			}
			return out
		}, nil
	default:
		return nil, fmt.Errorf("pre_tokenizer type %q is not supported", c.Type)
	}
}

func newSplit(c *componentJSON) (preTokenizer, error) {
	if c.Pattern == nil {
		return nil, fmt.Errorf("the Split component has no pattern")
	}
	switch c.Behavior {
	case "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous":
	default:
		return nil, fmt.Errorf("the Split component behavior %q is not supported", c.Behavior)
	}
	expr := ""
	switch {
	case c.Pattern.Regex != nil:
		expr = *c.Pattern.Regex
	case c.Pattern.String != nil:
		expr = regexp2.Escape(*c.Pattern.String)
	default:
		return nil, fmt.Errorf("the Split component pattern has neither String nor Regex")
	}
	re, err := compileRegex(expr)
	if err != nil {
		return nil, fmt.Errorf("the Split component: %w", err)
	}
	behavior, invert := c.Behavior, c.Invert
	return func(pieces []string, _ bool) []string {
		out := make([]string, 0, len(pieces))
		for _, p := range pieces {
			out = append(out, splitRegex(re, p, behavior, invert)...)
		}
		return out
	}, nil
}

// splitRegex splits s around the matches of re the way the reference's
// SplitDelimiterBehavior does. With invert, the matches are the content and
// the text between them the delimiters.
func splitRegex(re *regexp2.Regexp, s, behavior string, invert bool) []string {
	if s == "" {
		return nil
	}
	// Mark every byte range as delimiter or not.
	type span struct {
		start, end int
		delim      bool
	}
	var spans []span
	last := 0
	for _, m := range findAll(re, s) {
		if m[0] > last {
			spans = append(spans, span{last, m[0], invert})
		}
		spans = append(spans, span{m[0], m[1], !invert})
		last = m[1]
	}
	if last < len(s) {
		spans = append(spans, span{last, len(s), invert})
	}
	var out []string
	switch behavior {
	case "Removed":
		for _, sp := range spans {
			if !sp.delim {
				out = append(out, s[sp.start:sp.end])
			}
		}
	case "MergedWithPrevious":
		start := 0
		for _, sp := range spans {
			if sp.delim {
				out = append(out, s[start:sp.end])
				start = sp.end
			}
		}
		if start < len(s) {
			out = append(out, s[start:])
		}
	case "MergedWithNext":
		start := 0
		for _, sp := range spans {
			if sp.delim && sp.start > start {
				out = append(out, s[start:sp.start])
				start = sp.start
			}
		}
		if start < len(s) {
			out = append(out, s[start:])
		}
	case "Contiguous":
		for i := 0; i < len(spans); {
			j := i + 1
			for j < len(spans) && spans[j].delim && spans[i].delim {
				j++
			}
			out = append(out, s[spans[i].start:spans[j-1].end])
			i = j
		}
	default: // Isolated
		for _, sp := range spans {
			out = append(out, s[sp.start:sp.end])
		}
	}
	return out
}

func newMetaspace(c *componentJSON) (preTokenizer, error) {
	repl := c.Replacement
	if repl == "" {
		repl = "▁"
	}
	scheme := c.PrependScheme
	if scheme == "" {
		scheme = "always"
		if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			scheme = "never"
		}
	}
	switch scheme {
	case "always", "first", "never":
	default:
		return nil, fmt.Errorf("the Metaspace component prepend_scheme %q is not supported (want always, first or never)", scheme)
	}
	split := c.Split == nil || *c.Split
	return func(pieces []string, first bool) []string {
		out := make([]string, 0, len(pieces))
		for i, p := range pieces {
			p = strings.ReplaceAll(p, " ", repl)
			atStart := first && i == 0
			if p != "" && !strings.HasPrefix(p, repl) && (scheme == "always" || scheme == "first" && atStart) {
				p = repl + p
			}
			if !split {
				out = append(out, p)
				continue
			}
			// MergedWithNext: every replacement character starts a piece.
			start := 0
			for j := 0; j < len(p); {
				k := strings.Index(p[j:], repl)
				if k < 0 {
					break
				}
				if j+k > start {
					out = append(out, p[start:j+k])
					start = j + k
				}
				j += k + len(repl)
			}
			if start < len(p) {
				out = append(out, p[start:])
			}
		}
		return out
	}, nil
}

// splitDigits isolates runs of digits (or, with individual, each digit).
func splitDigits(s string, individual bool, out []string) []string {
	start := 0
	prevDigit := false
	for i, r := range s {
		d := unicode.IsDigit(r)
		if i > start && (d != prevDigit || d && individual) {
			out = append(out, s[start:i])
			start = i
		}
		prevDigit = d
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// byteToRune is GPT-2's bytes_to_unicode table: printable bytes map to
// themselves, the rest to code points from U+0100 up, so that every byte
// sequence becomes a string of visible characters.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := rune(0)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			b2r[b] = rune(b)
		} else {
			b2r[b] = 256 + n
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// byteLevelString maps every byte of s through byteToRune.
func byteLevelString(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteToRune[s[i]])
	}
	return b.String()
}

// byteLevelBytes inverts byteLevelString. A token containing a character
// outside the table (an added token such as "<|im_start|>" written with
// non-ASCII text) is passed through as its UTF-8 bytes, as the reference does.
func byteLevelBytes(tok string, dst []byte) []byte {
	start := len(dst)
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], tok...)
		}
		dst = append(dst, b)
	}
	return dst
}
