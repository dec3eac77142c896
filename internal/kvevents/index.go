package kvevents

import (
	"math/bits"
	"sync"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// Index records which engines hold which blocks, from their KV events: block
// hash → set of engines, plus each engine's own set (for its count and to
// clear it). Match answers a router's question per request: how many leading
// blocks of this prompt does each engine hold? It is safe for concurrent
// use: events take the write lock once per batch, lookups the read lock.
//
// An engine's set of holders is a bitset over engine slots, so a lookup
// intersects a few words per block whatever the number of engines holding
// it: at 1000 engines a block costs 16 ANDs.
//
// An engine with hybrid KV-cache groups (its events carry group_idx, and a
// sliding window for a sliding group's stores) gets the engine's own rule
// instead (see hybridHit): its prefix hit needs every full-attention
// group's blocks of the prefix and each sliding group's blocks from its
// window's start, so the index keeps every group's blocks for it, and
// matches it alone: a lookup per block and group, not a bit per engine.
type Index struct {
	mu      sync.RWMutex
	engines []*indexEngine // by slot; nil for a free slot
	byName  map[string]int
	free    []int
	blocks  map[uint64]*holders // group 0's blocks, every engine
	hybrid  holders             // slots of engines with hybrid groups
	rule    WindowRule
}

// WindowRule says which blocks a sliding-window group of window tokens must
// still hold for a prefix hit of k blocks of blockSize tokens: those from
// the block it returns to k−1. It never decreases as k grows.
type WindowRule func(window, blockSize, k int) int

// TandemWindows is Tandem's engines' rule (the scheduler's match): from the
// block holding the first position the window reads at position
// k·blockSize (kvlayout.FirstNeeded, aligned to the attention kernel's key
// chunks).
func TandemWindows(window, blockSize, k int) int {
	return kvlayout.FirstNeeded(window, k*blockSize) / blockSize
}

// VLLMWindows is vLLM's rule (SlidingWindowManager.find_longest_cache_hit):
// the last ⌈(window−1)/blockSize⌉ blocks before k.
func VLLMWindows(window, blockSize, k int) int {
	return max(0, k-(window-1+blockSize-1)/blockSize)
}

type indexEngine struct {
	name   string
	hashes map[uint64]struct{} // group 0's blocks
	// groups are a hybrid engine's KV-cache groups by group_idx (nil for
	// an engine with one group); group 0's blocks stay in hashes.
	groups    []indexGroup
	blockSize int // tokens per block, from its stores (0: unknown)
}

// indexGroup is one KV-cache group of a hybrid engine.
type indexGroup struct {
	window int                 // tokens; 0 for full attention
	hashes map[uint64]struct{} // nil for group 0 (indexEngine.hashes)
	// known is set by the group's first store (which says its window);
	// group 0 always counts.
	known bool
}

// maxGroups bounds the group_idx an engine may report (vLLM's hybrid
// models have a handful); events of higher groups are ignored.
const maxGroups = 64

// holders is a bitset of engine slots: slot s is bit s%64 of word s/64,
// word 0 inline so an index of up to 64 engines allocates one object per
// block.
type holders struct {
	w0   uint64
	rest []uint64
}

func (h *holders) word(w int) uint64 {
	if w == 0 {
		return h.w0
	}
	if w-1 < len(h.rest) {
		return h.rest[w-1]
	}
	return 0
}

func (h *holders) set(slot int) {
	if slot < 64 {
		h.w0 |= 1 << slot
		return
	}
	w := slot/64 - 1
	for len(h.rest) <= w {
		h.rest = append(h.rest, 0)
	}
	h.rest[w] |= 1 << (slot % 64)
}

// clear clears slot's bit and reports whether no bit is left.
func (h *holders) clear(slot int) bool {
	if slot < 64 {
		h.w0 &^= 1 << slot
	} else if w := slot/64 - 1; w < len(h.rest) {
		h.rest[w] &^= 1 << (slot % 64)
	}
	if h.w0 != 0 {
		return false
	}
	for _, w := range h.rest {
		if w != 0 {
			return false
		}
	}
	return true
}

// NewIndex returns an empty index for Tandem engines (TandemWindows).
func NewIndex() *Index { return NewIndexWithRule(TandemWindows) }

// NewIndexWithRule returns an empty index whose hybrid engines' sliding
// groups follow rule (VLLMWindows for vLLM engines).
func NewIndexWithRule(rule WindowRule) *Index {
	return &Index{byName: make(map[string]int), blocks: make(map[uint64]*holders), rule: rule}
}

// AddEngine adds an engine with no blocks; adding a known engine does
// nothing.
func (x *Index) AddEngine(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.slot(name)
}

func (x *Index) slot(name string) int {
	if s, ok := x.byName[name]; ok {
		return s
	}
	e := &indexEngine{name: name, hashes: make(map[uint64]struct{})}
	var s int
	if n := len(x.free); n > 0 {
		s = x.free[n-1]
		x.free = x.free[:n-1]
		x.engines[s] = e
	} else {
		s = len(x.engines)
		x.engines = append(x.engines, e)
	}
	x.byName[name] = s
	return s
}

// RemoveEngine forgets an engine and every block it held.
func (x *Index) RemoveEngine(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.byName[name]
	if !ok {
		return
	}
	x.clearSlot(s)
	x.hybrid.clear(s)
	x.engines[s] = nil
	delete(x.byName, name)
	x.free = append(x.free, s)
}

// ClearEngine forgets every block an engine held (AllBlocksCleared, a
// restart), keeping the engine.
func (x *Index) ClearEngine(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s, ok := x.byName[name]; ok {
		x.clearSlot(s)
	}
}

func (x *Index) clearSlot(s int) {
	e := x.engines[s]
	for h := range e.hashes {
		if hs := x.blocks[h]; hs != nil && hs.clear(s) {
			delete(x.blocks, h)
		}
	}
	e.hashes = make(map[uint64]struct{})
	for g := 1; g < len(e.groups); g++ {
		e.groups[g].hashes = make(map[uint64]struct{})
	}
}

// Apply applies one batch of an engine's events, adding the engine if it is
// new. Group 0's blocks (every engine's, Tandem's full-attention group when
// the model has one) go into the shared bitsets; an engine that reports
// another group or a sliding window becomes hybrid, and its other groups'
// blocks are kept per group.
func (x *Index) Apply(name string, b *Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.slot(name)
	e := x.engines[s]
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == AllBlocksCleared {
			x.clearSlot(s)
			continue
		}
		g := 0
		if ev.HasGroup {
			g = ev.Group
			if g < 0 || g >= maxGroups {
				continue
			}
			if g != 0 || ev.Window > 0 || e.groups != nil {
				x.hybridGroup(s, g, ev)
			}
		}
		if g != 0 {
			set := e.groups[g].hashes
			for _, h := range ev.Hashes {
				if ev.Kind == BlockStored {
					set[h] = struct{}{}
				} else if ev.Kind == BlockRemoved {
					delete(set, h)
				}
			}
			continue
		}
		switch ev.Kind {
		case BlockStored:
			x.store(s, ev.Hashes)
		case BlockRemoved:
			x.remove(s, ev.Hashes)
		}
	}
}

// hybridGroup makes the engine in slot s hybrid, with group g known, and
// takes the group's window and the block size from a store.
func (x *Index) hybridGroup(s, g int, ev *Event) {
	e := x.engines[s]
	if e.groups == nil {
		x.hybrid.set(s)
	}
	for len(e.groups) <= g {
		var set map[uint64]struct{}
		if len(e.groups) > 0 {
			set = make(map[uint64]struct{})
		}
		e.groups = append(e.groups, indexGroup{hashes: set})
	}
	if ev.Kind == BlockStored {
		e.groups[g].window, e.groups[g].known = max(ev.Window, 0), true
		if ev.BlockSize > 0 {
			e.blockSize = ev.BlockSize
		}
	}
}

// holds reports whether group g of hybrid engine e holds block h.
func (e *indexEngine) holds(g int, h uint64) bool {
	set := e.hashes
	if g > 0 {
		set = e.groups[g].hashes
	}
	_, ok := set[h]
	return ok
}

// hybridHit is the number of leading blocks of hashes a hybrid engine can
// use, by the engine's own rule (vLLM's find_longest_cache_hit, the
// scheduler's match): the longest prefix k that every full-attention group
// holds whole and every sliding group holds from the first block its
// window reads (rule) to block k−1. A sliding group's blocks before its window may be gone; a block it
// lacks inside the window ends the hit there even when the full groups
// hold more. Without a known block size a sliding group needs every block;
// a group that has stored nothing yet (its window unknown) is left out.
func (e *indexEngine) hybridHit(hashes []uint64, rule WindowRule) int {
	k := len(hashes)
	for g, gr := range e.groups {
		if (g > 0 && !gr.known) || (gr.window > 0 && e.blockSize > 0) {
			continue
		}
		n := 0
		for n < k && e.holds(g, hashes[n]) {
			n++
		}
		k = n
	}
	for k > 0 {
		// The highest block some window at k misses: no prefix reaching
		// past it can hit, so the next candidate ends there.
		miss := -1
		for g, gr := range e.groups {
			if (g > 0 && !gr.known) || gr.window == 0 || e.blockSize == 0 {
				continue
			}
			for j := k - 1; j >= rule(gr.window, e.blockSize, k); j-- {
				if !e.holds(g, hashes[j]) {
					miss = max(miss, j)
					break
				}
			}
		}
		if miss < 0 {
			break
		}
		k = miss
	}
	return k
}

func (x *Index) store(s int, hashes []uint64) {
	e := x.engines[s]
	for _, h := range hashes {
		if _, ok := e.hashes[h]; ok {
			continue
		}
		e.hashes[h] = struct{}{}
		hs := x.blocks[h]
		if hs == nil {
			hs = &holders{}
			x.blocks[h] = hs
		}
		hs.set(s)
	}
}

func (x *Index) remove(s int, hashes []uint64) {
	e := x.engines[s]
	for _, h := range hashes {
		if _, ok := e.hashes[h]; !ok {
			continue
		}
		delete(e.hashes, h)
		if hs := x.blocks[h]; hs != nil && hs.clear(s) {
			delete(x.blocks, h)
		}
	}
}

// Hit is one engine's prefix match.
type Hit struct {
	Engine string
	// Blocks is the number of leading blocks of the request the engine
	// holds.
	Blocks int
}

// Match appends to dst, for every engine holding at least the first of
// hashes (a request's chained block hashes, see BlockHashes), the number of
// leading blocks it holds, and returns the extended slice. Engines absent
// from the result hold none. Because hashes are chained, holding block i
// implies the engine computed blocks 0..i-1 once, but they may have been
// evicted since, so the match stops at the first block an engine lacks.
// An engine with hybrid KV-cache groups is matched by its own rule instead
// (hybridHit), which may count a hit whose first blocks a sliding group no
// longer holds.
func (x *Index) Match(hashes []uint64, dst []Hit) []Hit {
	if len(hashes) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	dst = x.matchPlain(hashes, dst)
	words := (len(x.engines) + 63) / 64
	for w := range words {
		set := x.hybrid.word(w)
		for set != 0 {
			b := bits.TrailingZeros64(set)
			set &^= 1 << b
			e := x.engines[w*64+b]
			if k := e.hybridHit(hashes, x.rule); k > 0 {
				dst = append(dst, Hit{Engine: e.name, Blocks: k})
			}
		}
	}
	return dst
}

// matchPlain is Match for the engines without hybrid groups, one bit per
// engine and block.
func (x *Index) matchPlain(hashes []uint64, dst []Hit) []Hit {
	first := x.blocks[hashes[0]]
	if first == nil {
		return dst
	}
	words := (len(x.engines) + 63) / 64
	var stack [16]uint64
	cur := stack[:0]
	if words > len(stack) {
		cur = make([]uint64, 0, words)
	}
	for w := range words {
		cur = append(cur, first.word(w)&^x.hybrid.word(w))
	}
	for i := 1; i < len(hashes); i++ {
		hs := x.blocks[hashes[i]]
		left := false
		for w := range cur {
			next := uint64(0)
			if hs != nil {
				next = cur[w] & hs.word(w)
			}
			if gone := cur[w] &^ next; gone != 0 {
				dst = x.emit(dst, w, gone, i)
			}
			cur[w] = next
			left = left || next != 0
		}
		if !left {
			return dst
		}
	}
	for w := range cur {
		dst = x.emit(dst, w, cur[w], len(hashes))
	}
	return dst
}

func (x *Index) emit(dst []Hit, w int, set uint64, n int) []Hit {
	for set != 0 {
		b := bits.TrailingZeros64(set)
		set &^= 1 << b
		dst = append(dst, Hit{Engine: x.engines[w*64+b].name, Blocks: n})
	}
	return dst
}

// Blocks returns the number of blocks the index holds for an engine.
func (x *Index) Blocks(name string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if s, ok := x.byName[name]; ok {
		return len(x.engines[s].hashes)
	}
	return 0
}

// Engines returns the number of engines in the index.
func (x *Index) Engines() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byName)
}
