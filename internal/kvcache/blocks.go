package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// BlockHash identifies the content of a full block: its tokens and, through
// the parent hash, every token before it.
type BlockHash [32]byte

// Free-list membership of a block.
const (
	inUse    = iota // ref > 0, on no list
	inFree          // ref == 0, not in the prefix cache
	inCached        // ref == 0, registered in the prefix cache (evictable)
)

type blockMeta struct {
	ref        int32
	list       int8
	hashed     bool
	hash       BlockHash
	group      int32 // the KV-cache group whose cache holds hash
	prev, next int32 // links of the list the block is on, -1 at the ends
}

// cacheKey is what the prefix cache is keyed by: a block's hash within one
// KV-cache group (a hybrid pool's groups cache the same tokens in
// different blocks, each holding its own layers).
type cacheKey struct {
	hash  BlockHash
	group int32
}

// list is an intrusive doubly-linked list of block ids threaded through
// blockMeta.prev/next; push at the tail, pop at the head (LRU order).
type list struct{ head, tail int32 }

// BlocksConfig sizes a Blocks.
type BlocksConfig struct {
	// BlockSize is the number of token slots per block (it decides which
	// tokens a block hash covers).
	BlockSize int
	// NumBlocks is the number of blocks; ids are 0 to NumBlocks-1.
	NumBlocks int
	// ExtraKey goes into every block hash so that blocks computed by a
	// different model can never be prefix hits (the model fingerprint).
	ExtraKey string
	// OnAllocate, if set, is called by Allocate with the blocks it takes for
	// new content, after it has taken them and before it returns them, so
	// before any caller can write to them. Pool sets it to
	// Memory.BumpGenerations: that is what keeps the generation seqlock of
	// the shared memory honest while the accounting never sees the memory.
	OnAllocate func(ids []int32)
	// Observer, if set, sees every change of the prefix cache (see
	// CacheObserver and SetObserver).
	Observer CacheObserver
}

// CacheObserver sees the prefix cache change, for KV cache events
// (internal/kvevents). Blocks calls it synchronously from the goroutine that
// owns it, so its methods must return quickly, must not block and must not
// call back into the Blocks.
type CacheObserver interface {
	// BlockStored reports that hash was registered by Cache. parent is the
	// hash of the block before it (the zero BlockHash for a first block) and
	// tokens the block's token ids, valid only during the call. Both come
	// from the HashBlock call that computed hash; when Blocks did not see
	// it (hashed before the observer was set, or so long ago that it was
	// forgotten), tokens is nil and parent is zero: unknown.
	BlockStored(hash, parent BlockHash, tokens []int32)
	// BlockRemoved reports that hash is no longer registered: its block
	// was taken for new content (evicted) or Uncache dropped it.
	BlockRemoved(hash BlockHash)
}

// GroupCacheObserver is a CacheObserver that sees the prefix cache of every
// KV-cache group (a hybrid pool's, see kvlayout.Grouped), each change with
// its group; a plain CacheObserver sees group 0's only.
type GroupCacheObserver interface {
	CacheObserver
	// GroupBlockStored is BlockStored in KV-cache group g.
	GroupBlockStored(g int, hash, parent BlockHash, tokens []int32)
	// GroupBlockRemoved is BlockRemoved in KV-cache group g.
	GroupBlockRemoved(g int, hash BlockHash)
}

// hashedBlock is what HashBlock saw of a hash, kept for BlockStored.
type hashedBlock struct {
	parent BlockHash
	tokens []int32
}

// Blocks is the accounting of a pool's blocks, with no memory behind it:
// reference counts, the free list in LRU order, and the prefix cache of
// chained block hashes. It touches no file and no clock, so a scheduler can
// be tested against it step by step. See the package documentation for the
// model. It is not safe for concurrent use.
type Blocks struct {
	blockSize  int
	extraKey   []byte
	onAllocate func([]int32)
	blocks     []blockMeta
	free       list // uncached free blocks, handed out first
	cached     list // cached free blocks, least recently freed at the head
	numFree    int  // blocks on free and cached
	cache      map[cacheKey]int32

	// With an observer, HashBlock remembers the parent and tokens of each
	// hash until Cache registers it, in two generations of at most
	// len(blocks) entries each: hashes that are never cached (prefix hits,
	// duplicates, aborted requests) age out when the newer generation
	// fills. Both are nil without an observer.
	observer          CacheObserver
	groupObserver     GroupCacheObserver // observer, when it sees every group
	hashed, hashedOld map[BlockHash]hashedBlock

	prefixQueries, prefixHits uint64
}

// NewBlocks returns the accounting of cfg.NumBlocks blocks, all free.
func NewBlocks(cfg BlocksConfig) (*Blocks, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("kvcache: block size %d must be positive", cfg.BlockSize)
	}
	if cfg.NumBlocks <= 0 || cfg.NumBlocks > maxBlocks {
		return nil, fmt.Errorf("kvcache: %d blocks: want 1 to %d (block ids are int32)", cfg.NumBlocks, maxBlocks)
	}
	b := &Blocks{
		blockSize:  cfg.BlockSize,
		extraKey:   []byte(cfg.ExtraKey),
		onAllocate: cfg.OnAllocate,
		blocks:     make([]blockMeta, cfg.NumBlocks),
		free:       list{-1, -1},
		cached:     list{-1, -1},
		cache:      make(map[cacheKey]int32),
	}
	b.SetObserver(cfg.Observer)
	for i := range b.blocks {
		b.blocks[i].prev, b.blocks[i].next = -1, -1
		b.push(&b.free, int32(i), inFree)
	}
	return b, nil
}

// maxBlocks is the largest number of blocks: ids are int32.
const maxBlocks = 1<<31 - 1

// SetObserver makes o see the prefix cache's changes from now on (nil: none).
// Blocks registered before stay unreported.
func (b *Blocks) SetObserver(o CacheObserver) {
	b.observer = o
	b.groupObserver, _ = o.(GroupCacheObserver)
	b.hashed, b.hashedOld = nil, nil
	if o != nil {
		b.hashed = make(map[BlockHash]hashedBlock)
	}
}

// NumBlocks returns the number of blocks.
func (b *Blocks) NumBlocks() int { return len(b.blocks) }

// BlockSize returns the number of token slots per block.
func (b *Blocks) BlockSize() int { return b.blockSize }

// FreeBlocks returns the number of blocks with no reference, cached or not:
// the number a caller can allocate now.
func (b *Blocks) FreeBlocks() int { return b.numFree }

// Usage is the fraction of blocks in use (vllm:kv_cache_usage_perc).
func (b *Blocks) Usage() float64 { return 1 - float64(b.numFree)/float64(len(b.blocks)) }

// RefCount returns the number of holders of block id.
func (b *Blocks) RefCount(id int32) int { return int(b.blocks[id].ref) }

// Cached reports whether block id is registered in the prefix cache.
func (b *Blocks) Cached(id int32) bool { return b.blocks[id].hashed }

// NumCachedBlocks returns the number of blocks registered in the prefix cache.
func (b *Blocks) NumCachedBlocks() int { return len(b.cache) }

// HashBlock returns the hash of a full block holding tokens whose preceding
// blocks hash to parent (the zero BlockHash for the first block).
func (b *Blocks) HashBlock(parent BlockHash, tokens []int32) BlockHash {
	h := hashBlock(b.extraKey, parent, tokens)
	if b.observer != nil {
		b.remember(h, parent, tokens)
	}
	return h
}

// ExtendHashes appends to hashes the hashes of the full blocks of tokens
// that hashes does not cover yet, and returns the extended slice. hashes must
// be the hashes of the first len(hashes) blocks of tokens.
func (b *Blocks) ExtendHashes(hashes []BlockHash, tokens []int32) []BlockHash {
	bs := b.blockSize
	for i := len(hashes); (i+1)*bs <= len(tokens); i++ {
		var parent BlockHash
		if i > 0 {
			parent = hashes[i-1]
		}
		hashes = append(hashes, b.HashBlock(parent, tokens[i*bs:(i+1)*bs]))
	}
	return hashes
}

// BlockHashes appends to hashes the chained hashes of the full blocks of
// tokens that hashes does not cover yet, exactly as the prefix cache of a
// Blocks with this block size and extra key (the model fingerprint) computes
// them: a router predicting an engine's prefix hits calls it. A block's hash
// is SHA-256 over the parent block's hash (32 zero bytes for the first
// block), the number of tokens and each token id as little-endian uint32,
// then the extra key.
func BlockHashes(extraKey string, blockSize int, hashes []BlockHash, tokens []int32) []BlockHash {
	if blockSize <= 0 {
		return hashes
	}
	key := []byte(extraKey)
	for i := len(hashes); (i+1)*blockSize <= len(tokens); i++ {
		var parent BlockHash
		if i > 0 {
			parent = hashes[i-1]
		}
		hashes = append(hashes, hashBlock(key, parent, tokens[i*blockSize:(i+1)*blockSize]))
	}
	return hashes
}

func hashBlock(extraKey []byte, parent BlockHash, tokens []int32) BlockHash {
	h := sha256.New()
	h.Write(parent[:])
	var buf [4]byte
	binary.LittleEndian.PutUint32(buf[:], uint32(len(tokens)))
	h.Write(buf[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[:], uint32(t))
		h.Write(buf[:])
	}
	h.Write(extraKey)
	var out BlockHash
	h.Sum(out[:0])
	return out
}

// remember keeps what HashBlock saw of h for the BlockStored of its Cache.
func (b *Blocks) remember(h, parent BlockHash, tokens []int32) {
	if _, ok := b.hashed[h]; ok {
		return
	}
	if len(b.hashed) >= max(len(b.blocks), 1024) {
		b.hashedOld, b.hashed = b.hashed, make(map[BlockHash]hashedBlock, len(b.hashed))
	}
	b.hashed[h] = hashedBlock{parent: parent, tokens: append([]int32(nil), tokens...)}
}

// recall returns what HashBlock saw of h. With one KV-cache group it
// forgets it (a hash is cached once); a GroupCacheObserver keeps it for the
// other groups' stores of the same tokens, until the generations age out.
func (b *Blocks) recall(h BlockHash) (hashedBlock, bool) {
	keep := b.groupObserver != nil
	if hb, ok := b.hashed[h]; ok {
		if !keep {
			delete(b.hashed, h)
		}
		return hb, true
	}
	if hb, ok := b.hashedOld[h]; ok {
		if !keep {
			delete(b.hashedOld, h)
		}
		return hb, true
	}
	return hashedBlock{}, false
}

// stored reports hash cached in group g to the observer.
func (b *Blocks) stored(g int32, hash BlockHash) {
	switch {
	case b.groupObserver != nil:
		hb, _ := b.recall(hash)
		b.groupObserver.GroupBlockStored(int(g), hash, hb.parent, hb.tokens)
	case b.observer != nil && g == 0:
		hb, _ := b.recall(hash)
		b.observer.BlockStored(hash, hb.parent, hb.tokens)
	}
}

// removed reports hash no longer cached in group g to the observer.
func (b *Blocks) removed(g int32, hash BlockHash) {
	switch {
	case b.groupObserver != nil:
		b.groupObserver.GroupBlockRemoved(int(g), hash)
	case b.observer != nil && g == 0:
		b.observer.BlockRemoved(hash)
	}
}

// Match returns the blocks caching the longest prefix of hashes, without
// taking references (see Touch): MatchGroup of group 0.
func (b *Blocks) Match(hashes []BlockHash) []int32 { return b.MatchGroup(0, hashes) }

// MatchGroup returns the blocks of KV-cache group g caching the longest
// prefix of hashes, without taking references.
func (b *Blocks) MatchGroup(g int, hashes []BlockHash) []int32 {
	var ids []int32
	for _, h := range hashes {
		id, ok := b.cache[cacheKey{h, int32(g)}]
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return ids
}

// Lookup returns the block of KV-cache group g cached under hash, without
// taking a reference.
func (b *Blocks) Lookup(g int, hash BlockHash) (int32, bool) {
	id, ok := b.cache[cacheKey{hash, int32(g)}]
	return id, ok
}

// RecordPrefixQuery counts one prefix-cache lookup of queried tokens of which
// hit were found (vllm:prefix_cache_queries and _hits).
func (b *Blocks) RecordPrefixQuery(queried, hit int) {
	b.prefixQueries += uint64(queried)
	b.prefixHits += uint64(hit)
}

// PrefixStats returns the totals recorded by RecordPrefixQuery, in tokens.
func (b *Blocks) PrefixStats() (queries, hits uint64) { return b.prefixQueries, b.prefixHits }

// Touch takes a reference on each block in ids (cache hits), taking free
// cached blocks off the free list. The blocks keep their content, so their
// generations do not change.
func (b *Blocks) Touch(ids []int32) {
	for _, id := range ids {
		m := &b.blocks[id]
		if m.ref == 0 {
			b.unlink(id)
		}
		m.ref++
	}
}

// Allocate takes n blocks for new content, uncached free blocks first, then
// the least recently freed cached blocks (evicting them from the cache). Each
// block gets one reference, and OnAllocate sees the ids before Allocate
// returns them. It returns false and changes nothing when fewer than n blocks
// are free.
func (b *Blocks) Allocate(n int) ([]int32, bool) {
	if n < 0 || n > b.numFree {
		return nil, false
	}
	ids := make([]int32, 0, n)
	for range n {
		l := &b.free
		if l.head < 0 {
			l = &b.cached
		}
		id := l.head
		b.unlink(id)
		m := &b.blocks[id]
		if m.hashed {
			delete(b.cache, cacheKey{m.hash, m.group})
			m.hashed = false
			b.removed(m.group, m.hash)
		}
		m.ref = 1
		ids = append(ids, id)
	}
	if b.onAllocate != nil && n > 0 {
		b.onAllocate(ids)
	}
	return ids, true
}

// ErrNotHeld is returned by Free for a block that has no reference.
var ErrNotHeld = errors.New("kvcache: block freed without a reference")

// Free drops one reference on each block in ids. Blocks are released in
// reverse order, so a request's tail blocks (the least likely to be shared)
// are evicted before its head blocks. A block left with no reference goes to
// the free list, cached or not. Freeing a block without a reference skips it
// and reports ErrNotHeld.
func (b *Blocks) Free(ids []int32) error {
	var bad []int32
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if id < 0 || int(id) >= len(b.blocks) || b.blocks[id].ref <= 0 {
			bad = append(bad, id)
			continue
		}
		m := &b.blocks[id]
		m.ref--
		if m.ref == 0 {
			if m.hashed {
				b.push(&b.cached, id, inCached)
			} else {
				b.push(&b.free, id, inFree)
			}
		}
	}
	if bad != nil {
		return fmt.Errorf("%w: blocks %v", ErrNotHeld, bad)
	}
	return nil
}

// Cache registers block id, whose KV for a full block of tokens is complete,
// under hash: CacheGroup of group 0.
func (b *Blocks) Cache(id int32, hash BlockHash) bool { return b.CacheGroup(0, id, hash) }

// CacheGroup registers block id of KV-cache group g, whose KV for a full
// block of tokens is complete, under hash in that group. It returns false
// and changes nothing when another block of g already caches hash (the
// duplicate stays private to its holder) or when id is already registered.
// A plain CacheObserver sees group 0's changes only, a GroupCacheObserver
// every group's.
func (b *Blocks) CacheGroup(g int, id int32, hash BlockHash) bool {
	m := &b.blocks[id]
	if m.hashed {
		return false
	}
	key := cacheKey{hash, int32(g)}
	if _, dup := b.cache[key]; dup {
		return false
	}
	m.hashed, m.hash, m.group = true, hash, int32(g)
	b.cache[key] = id
	if m.list == inFree { // freed before being cached: keep the list honest
		b.unlink(id)
		b.push(&b.cached, id, inCached)
	}
	b.stored(int32(g), hash)
	return true
}

// Uncache removes block id from the prefix cache (its content turned out to
// be invalid), so nobody can hit it again.
func (b *Blocks) Uncache(id int32) {
	m := &b.blocks[id]
	if !m.hashed {
		return
	}
	delete(b.cache, cacheKey{m.hash, m.group})
	m.hashed = false
	b.removed(m.group, m.hash)
	if m.list == inCached {
		b.unlink(id)
		b.push(&b.free, id, inFree)
	}
}

func (b *Blocks) push(l *list, id int32, kind int8) {
	m := &b.blocks[id]
	m.list, m.prev, m.next = kind, l.tail, -1
	if l.tail >= 0 {
		b.blocks[l.tail].next = id
	} else {
		l.head = id
	}
	l.tail = id
	b.numFree++
}

func (b *Blocks) unlink(id int32) {
	m := &b.blocks[id]
	l := &b.free
	if m.list == inCached {
		l = &b.cached
	}
	if m.prev >= 0 {
		b.blocks[m.prev].next = m.next
	} else {
		l.head = m.next
	}
	if m.next >= 0 {
		b.blocks[m.next].prev = m.prev
	} else {
		l.tail = m.prev
	}
	m.list, m.prev, m.next = inUse, -1, -1
	b.numFree--
}
