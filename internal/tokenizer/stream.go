package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns generated ids into text one id at a time, for
// streaming responses. Text is released only once it is final: a character
// split across several byte tokens is held back until complete, and a
// SentencePiece token's leading space is kept or dropped exactly as Decode
// of the whole sequence would. Concatenating everything Add and Flush return
// equals Decode(prompt+completion) without the Decode(prompt) prefix.
//
// It uses vLLM's method: decode a short window of recent ids twice, with and
// without the ids not yet released, and release the difference. A
// StreamDecoder belongs to one sequence and is not safe for concurrent use.
type StreamDecoder struct {
	t    *Tokenizer
	skip bool
	ids  []int32 // ids from the start of the window on
	read int     // ids[:read] have been released
}

// promptContext is how many prompt ids seed the window (vLLM uses 5): enough
// for the decoder to see the context a new token's text depends on.
const promptContext = 5

// NewDecoder returns a StreamDecoder for a completion of prompt. With
// skipSpecial, special tokens produce no text.
func NewDecoder(t *Tokenizer, skipSpecial bool, prompt []int32) *StreamDecoder {
	start := max(0, len(prompt)-promptContext)
	// Start the window on a character boundary: a window that began with the
	// tail of a multi-byte character would decode it differently from the
	// whole sequence.
	for lim := 0; start > 0 && lim < utf8.UTFMax && t.startsMidCharacter(prompt[start]); lim++ {
		start--
	}
	ids := append(make([]int32, 0, len(prompt)-start+16), prompt[start:]...)
	return &StreamDecoder{t: t, skip: skipSpecial, ids: ids, read: len(ids)}
}

// startsMidCharacter reports whether the first byte of id's text is a UTF-8
// continuation byte.
func (t *Tokenizer) startsMidCharacter(id int32) bool {
	if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" {
		return false
	}
	s := t.decodeTokens([]string{t.tokens[id]}, true)
	return s != "" && !utf8.RuneStart(s[0])
}

// Add appends one generated id and returns the text that became final, often
// "" (for example while a multi-byte character is incomplete).
func (d *StreamDecoder) Add(id int32) string {
	d.ids = append(d.ids, id)
	return d.release(false)
}

// Flush returns any text still held back, such as an incomplete character
// at the end of generation (rendered as U+FFFD, as Decode would).
func (d *StreamDecoder) Flush() string { return d.release(true) }

func (d *StreamDecoder) release(final bool) string {
	if d.read == len(d.ids) {
		return ""
	}
	prev := d.t.Decode(d.ids[:d.read], d.skip)
	cur := d.t.Decode(d.ids, d.skip)
	if len(cur) <= len(prev) && !final || !final && strings.HasSuffix(cur, "\uFFFD") {
		return ""
	}
	var out string
	if strings.HasPrefix(cur, prev) {
		out = cur[len(prev):]
	} else {
		// Only when the prompt itself ended inside a character: release
		// what differs, from a character boundary.
		n := 0
		for n < len(prev) && n < len(cur) && prev[n] == cur[n] {
			n++
		}
		for n > 0 && n < len(cur) && !utf8.RuneStart(cur[n]) {
			n--
		}
		out = cur[n:]
	}
	// The released ids become the context of the next window.
	d.ids = append(d.ids[:0], d.ids[d.read:]...)
	d.read = len(d.ids)
	return out
}
