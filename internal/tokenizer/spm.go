package tokenizer

import "fmt"

// spm is a SentencePiece vocabulary merged the way llama.cpp's SPM
// tokenizer does (llm_tokenizer_spm_session): starting from the UTF-8
// characters of the text, the adjacent pair whose concatenation is a token
// with the highest score is merged first (the leftmost on equal scores),
// until no adjacent pair forms a token; a piece that is not a token becomes
// its bytes' <0xXX> tokens.
type spm struct {
	vocab  map[string]int32
	scores []float32
	bytes  [256]int32
}

func newSPM(vocab map[string]int32, scores []float32, unk int32) *spm {
	s := &spm{vocab: vocab, scores: scores}
	for b := range s.bytes {
		id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id, ok = vocab[string([]byte{byte(b)})]
		}
		if !ok {
			id = unk
		}
		s.bytes[b] = id
	}
	return s
}

type spmSymbol struct {
	start, n   int
	prev, next int
}

// spmBigram is a possible merge of the symbol at pos (the left one) with
// the symbol val.right, keyed by the merged piece's score negated: the
// highest score merges first, then the leftmost.
type spmBigram = queuedMerge[float32, int, spmRight]

// spmRight is the rest of a queued SentencePiece merge: the right symbol,
// and the merged piece's length in bytes, which tells a stale entry (one
// of the two symbols merged since) from a live one.
type spmRight struct {
	right, size int
}

func (s *spm) encode(text string, dst []int32) []int32 {
	if text == "" {
		return dst
	}
	syms := make([]spmSymbol, 0, len(text))
	for off := 0; off < len(text); {
		n := utf8SeqLen(text[off])
		n = min(n, len(text)-off)
		syms = append(syms, spmSymbol{start: off, n: n, prev: len(syms) - 1, next: len(syms) + 1})
		off += n
	}
	syms[len(syms)-1].next = -1
	var queue []spmBigram
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		piece := text[syms[l].start : syms[l].start+syms[l].n+syms[r].n]
		id, ok := s.vocab[piece]
		if !ok || int(id) >= len(s.scores) {
			return
		}
		queue = pushMerge(queue, spmBigram{key: -s.scores[id], pos: l, val: spmRight{right: r, size: len(piece)}})
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for len(queue) > 0 {
		var b spmBigram
		b, queue = popMerge(queue)
		l, r := &syms[b.pos], &syms[b.val.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.val.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.pos
		}
		try(l.prev, b.pos)
		try(b.pos, l.next)
	}
	for i := 0; i != -1; i = syms[i].next {
		piece := text[syms[i].start : syms[i].start+syms[i].n]
		if id, ok := s.vocab[piece]; ok {
			dst = append(dst, id)
			continue
		}
		for j := 0; j < len(piece); j++ {
			if id := s.bytes[piece[j]]; id >= 0 {
				dst = append(dst, id)
			}
		}
	}
	return dst
}

// utf8SeqLen is the length of the UTF-8 sequence a lead byte starts, by
// its top four bits, as llama.cpp's unicode_len_utf8 (1 for continuation
// bytes).
func utf8SeqLen(b byte) int {
	switch b >> 4 {
	case 12, 13:
		return 2
	case 14:
		return 3
	case 15:
		return 4
	}
	return 1
}
