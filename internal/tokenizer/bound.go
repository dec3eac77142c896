package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Bounding the work of an over-long prompt. Encoding a text allocates
// many times its size at once (a 10 MB prompt took an engine from 38 MB
// to 700 MB): the regex pre-tokenizers work on a rune copy of the whole
// text and return every piece, and a model without a pre-tokenizer runs
// BPE over the whole text as one word. A prompt longer than the model's
// context is refused anyway, so EncodeBounded first counts the text's
// tokens chunk by chunk, each chunk encoded and dropped before the next,
// and stops as soon as the count shows the text cannot fit; only a text
// that may fit is then encoded whole, exactly as Encode does.
//
// No byte length can be refused before tokenizing: a token may stand for
// any number of input bytes (whitespace a pre-tokenizer drops, characters
// a normalizer removes, long vocabulary entries), so the count is the only
// sound test.

const (
	// boundChunkBytes is the size of one chunk of the estimate: small
	// enough that encoding it allocates a few MB, large enough that the
	// per-chunk overhead and the cuts are negligible.
	boundChunkBytes = 16 << 10
	// boundCutWindow is how far back from a chunk's end a cut looks for
	// whitespace.
	boundCutWindow = 1 << 10
	// boundCutSlack is how many tokens a cut may add to the count: at a
	// cut before whitespace the pieces on either side are those of the
	// whole text, give or take a prepended word marker; a cut inside a
	// longer run changes the tokens of the piece it splits, and BPE merges
	// reach only a few tokens from it.
	boundCutSlack = 32
)

// EncodeBounded is Encode for text that must fit in max tokens (the
// model's context). When the text has more than max tokens it returns
// false and nil, having encoded only a little more than max tokens' worth
// of it, one chunk at a time; otherwise it returns true and exactly what
// Encode returns (which may still exceed max by a few tokens: the caller
// checks the length).
func (t *Tokenizer) EncodeBounded(text string, addSpecial bool, max int) ([]int32, bool) {
	if len(text) > boundChunkBytes && t.countExceeds(text, addSpecial, max) {
		return nil, false
	}
	ids := t.Encode(text, addSpecial)
	return ids, true
}

// countExceeds encodes text chunk by chunk and reports whether it has
// more than max tokens, stopping at the first chunk that shows it. The
// count of chunks may exceed the whole text's by boundCutSlack per cut,
// which the test allows for, so a text that fits is never refused.
func (t *Tokenizer) countExceeds(text string, addSpecial bool, max int) bool {
	n := 0
	if addSpecial {
		for _, it := range t.template {
			n += len(it.ids)
		}
	}
	var buf []int32
	for start, cuts := 0, 0; start < len(text); cuts++ {
		end := chunkEnd(text, start)
		chunk := text[start:end]
		if !utf8.ValidString(chunk) {
			chunk = strings.ToValidUTF8(chunk, "\uFFFD")
		}
		buf = t.encode(chunk, buf[:0], start == 0)
		n += len(buf)
		if n > max+cuts*boundCutSlack {
			return true
		}
		start = end
	}
	return false
}

// chunkEnd is where the chunk starting at start ends: before the last
// whitespace that follows a non-space within boundCutWindow of
// boundChunkBytes, else at the last rune start there, else at the text's
// end.
func chunkEnd(text string, start int) int {
	end := start + boundChunkBytes
	if end >= len(text) {
		return len(text)
	}
	for i := end; i > end-boundCutWindow; i-- {
		if isASCIISpace(text[i]) && !isASCIISpace(text[i-1]) {
			return i
		}
	}
	for i := end; i > end-utf8.UTFMax; i-- {
		if utf8.RuneStart(text[i]) {
			return i
		}
	}
	return end
}

func isASCIISpace(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }
