package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// bpe is the byte-pair-encoding model of tokenizer.json. It maps one
// pre-tokenized word to ids, reproducing the merge order of Hugging Face's
// implementation exactly: the adjacent pair with the lowest merge rank is
// merged first, the leftmost one on ties.
type bpe struct {
	vocab        map[string]int32
	merges       map[uint64]merge
	unk          int32 // -1 when the model has no unknown token
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	byteTokens   [256]int32
	cache        wordCache
}

// merge is what one pair of ids merges into and at which priority.
type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func newBPE(m *modelJSON) (*bpe, error) {
	switch m.Type {
	case "", "BPE":
	default:
		return nil, fmt.Errorf("model type %q is not supported (only BPE is): use a model whose tokenizer.json has a BPE model", m.Type)
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("model.vocab is empty")
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return nil, fmt.Errorf("model.dropout %v is a training-time option and not supported: set it to null", *m.Dropout)
	}
	b := &bpe{
		vocab:        m.Vocab,
		merges:       make(map[uint64]merge, len(m.Merges)),
		unk:          -1,
		fuseUnk:      m.FuseUnk,
		byteFallback: m.ByteFallback,
		ignoreMerges: m.IgnoreMerges,
	}
	if m.ContinuingSubwordPrefix != nil {
		b.prefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		b.suffix = *m.EndOfWordSuffix
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in the vocabulary", *m.UnkToken)
		}
		b.unk = id
	}
	for i := range b.byteTokens {
		b.byteTokens[i] = -1
		if id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.byteTokens[i] = id
		}
	}
	for rank, raw := range m.Merges {
		left, right, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %w", rank, err)
		}
		a, okA := m.Vocab[left]
		c, okC := m.Vocab[right]
		if !okA || !okC {
			return nil, fmt.Errorf("model.merges[%d] (%q %q) uses a token missing from the vocabulary", rank, left, right)
		}
		merged := left + trimPrefix(right, b.prefix)
		id, ok := m.Vocab[merged]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d] (%q %q) produces %q, which is missing from the vocabulary", rank, left, right, merged)
		}
		k := pairKey(a, c)
		if _, dup := b.merges[k]; !dup { // the first (highest-priority) occurrence wins
			b.merges[k] = merge{rank: int32(rank), id: id}
		}
	}
	return b, nil
}

func trimPrefix(s, p string) string {
	if p != "" && len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// encode appends the ids of word to dst.
func (b *bpe) encode(word string, dst []int32) []int32 {
	if word == "" {
		return dst
	}
	if b.ignoreMerges {
		if id, ok := b.vocab[word]; ok {
			return append(dst, id)
		}
	}
	if ids, ok := b.cache.get(word); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = b.mergeWord(word, dst)
	b.cache.put(word, dst[start:])
	return dst
}

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         int32
	prev, next int32
	dead       bool
}

// candidate is a possible merge of the symbol at pos with its successor,
// keyed by the merge's rank; val is the merged token's id.
type candidate = queuedMerge[int32, int32, int32]

func (b *bpe) mergeWord(word string, dst []int32) []int32 {
	var symBuf [32]symbol
	syms := b.initialSymbols(word, symBuf[:0])
	if len(syms) == 0 {
		return dst
	}
	for i := range syms {
		syms[i].prev, syms[i].next = int32(i)-1, int32(i)+1
	}
	syms[len(syms)-1].next = -1

	var heapBuf [32]candidate
	h := heapBuf[:0]
	for i := 0; i+1 < len(syms); i++ {
		if m, ok := b.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = pushMerge(h, candidate{key: m.rank, pos: int32(i), val: m.id})
		}
	}
	for len(h) > 0 {
		var top candidate
		top, h = popMerge(h)
		s := &syms[top.pos]
		if s.dead || s.next < 0 {
			continue
		}
		right := &syms[s.next]
		// Entries go stale when a neighbour merged since they were pushed.
		if m, ok := b.merges[pairKey(s.id, right.id)]; !ok || m.id != top.val {
			continue
		}
		s.id = top.val
		right.dead = true
		s.next = right.next
		if s.next >= 0 {
			syms[s.next].prev = top.pos
		}
		if s.prev >= 0 {
			if m, ok := b.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				h = pushMerge(h, candidate{key: m.rank, pos: s.prev, val: m.id})
			}
		}
		if s.next >= 0 {
			if m, ok := b.merges[pairKey(s.id, syms[s.next].id)]; ok {
				h = pushMerge(h, candidate{key: m.rank, pos: top.pos, val: m.id})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// initialSymbols appends one symbol per character of word (or its byte
// tokens with byte_fallback, or the unknown token), before any merge.
func (b *bpe) initialSymbols(word string, syms []symbol) []symbol {
	unk, haveUnk := int32(0), false
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		s := word[i : i+size]
		if i > 0 && b.prefix != "" {
			s = b.prefix + s
		}
		if i+size == len(word) && b.suffix != "" {
			s += b.suffix
		}
		i += size
		if id, ok := b.vocab[s]; ok {
			if haveUnk {
				syms = append(syms, symbol{id: unk})
				haveUnk = false
			}
			syms = append(syms, symbol{id: id})
			continue
		}
		if b.byteFallback && b.hasByteTokens(s) {
			if haveUnk {
				syms = append(syms, symbol{id: unk})
				haveUnk = false
			}
			for j := 0; j < len(s); j++ {
				syms = append(syms, symbol{id: b.byteTokens[s[j]]})
			}
			continue
		}
		if b.unk >= 0 {
			if haveUnk && !b.fuseUnk {
				syms = append(syms, symbol{id: unk})
			}
			unk, haveUnk = b.unk, true
		}
	}
	if haveUnk {
		syms = append(syms, symbol{id: unk})
	}
	return syms
}

func (b *bpe) hasByteTokens(s string) bool {
	for j := 0; j < len(s); j++ {
		if b.byteTokens[s[j]] < 0 {
			return false
		}
	}
	return true
}

// wordCache remembers the ids of recently seen words. Words repeat a lot in
// natural text, and a lookup is several times cheaper than merging; the
// benchmark in bpe_test.go measures the difference.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

const (
	maxCachedWords   = 1 << 16
	maxCachedWordLen = 256
)

func (c *wordCache) get(w string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[w]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	if len(w) > maxCachedWordLen {
		return
	}
	cp := append([]int32(nil), ids...)
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string][]int32)
	}
	if len(c.m) < maxCachedWords {
		c.m[w] = cp
	}
	c.mu.Unlock()
}
