package kvevents

import (
	"math/bits"
	"sync"
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
type Index struct {
	mu      sync.RWMutex
	engines []*indexEngine // by slot; nil for a free slot
	byName  map[string]int
	free    []int
	blocks  map[uint64]*holders
}

type indexEngine struct {
	name   string
	hashes map[uint64]struct{}
}

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

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{byName: make(map[string]int), blocks: make(map[uint64]*holders)}
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
}

// Apply applies one batch of an engine's events, adding the engine if it is
// new.
func (x *Index) Apply(name string, b *Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.slot(name)
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.HasGroup && ev.Group != 0 {
			// An engine with hybrid KV-cache groups: the index keeps
			// group 0's blocks (Tandem's full-attention group when the
			// model has one), which a prefix hit needs whole.
			continue
		}
		switch ev.Kind {
		case BlockStored:
			x.store(s, ev.Hashes)
		case BlockRemoved:
			x.remove(s, ev.Hashes)
		case AllBlocksCleared:
			x.clearSlot(s)
		}
	}
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
func (x *Index) Match(hashes []uint64, dst []Hit) []Hit {
	if len(hashes) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
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
		cur = append(cur, first.word(w))
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
