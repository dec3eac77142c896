package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tandem-serve/tandem/internal/model"
)

// DefaultBlockSize is the number of token slots per block when the
// configuration leaves it zero (vLLM's default).
const DefaultBlockSize = 16

// Config sizes a Pool. Exactly one of NumBlocks and MemoryBytes is needed;
// NumBlocks wins when both are set.
type Config struct {
	// Layout is the model's KV layout; Layout.BlockSize 0 means
	// DefaultBlockSize.
	Layout model.KVLayout
	// NumBlocks is the number of blocks in the pool.
	NumBlocks int
	// MemoryBytes sizes the pool as MemoryBytes / Layout.BlockBytes() blocks
	// (vLLM's kv_cache_memory_bytes).
	MemoryBytes int64
	// Dir, when set, puts the pool in a named file in that directory
	// (removed at Close). Empty — the default — makes it an anonymous
	// memory file that cannot outlive the process.
	Dir string
	// ExtraKey goes into every block hash so that blocks computed by a
	// different model can never be prefix hits (the model fingerprint).
	ExtraKey string
}

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
	prev, next int32 // links of the list the block is on, -1 at the ends
}

// list is an intrusive doubly-linked list of block ids threaded through
// blockMeta.prev/next; push at the tail, pop at the head (LRU order).
type list struct{ head, tail int32 }

// Pool is the KV memory and block accounting of one engine. See the package
// documentation for the model; all methods must be called from one
// goroutine, except Generation.
type Pool struct {
	m        *mapping
	extraKey []byte
	blocks   []blockMeta
	free     list // uncached free blocks, handed out first
	cached   list // cached free blocks, least recently freed at the head
	numFree  int  // blocks on free and cached
	cache    map[BlockHash]int32

	prefixQueries, prefixHits uint64
}

// New creates a pool and its shared memory file. Close releases both.
func New(cfg Config) (*Pool, error) {
	layout := cfg.Layout
	if layout.BlockSize == 0 {
		layout.BlockSize = DefaultBlockSize
	}
	if layout.BlockSize < 0 || layout.Layers <= 0 || layout.KVHeads <= 0 || layout.HeadDim <= 0 {
		return nil, fmt.Errorf("kvcache: invalid KV layout %+v: block size, layers, kv heads and head dim must be positive", layout)
	}
	n := cfg.NumBlocks
	if n == 0 && cfg.MemoryBytes > 0 {
		n64 := cfg.MemoryBytes / int64(layout.BlockBytes())
		if n64 > 1<<31-1 {
			n64 = 1<<31 - 1
		}
		n = int(n64)
		if n == 0 {
			return nil, fmt.Errorf("kvcache: %d bytes of KV-cache memory hold no block of %d bytes: raise --kv-cache-memory or lower --block-size", cfg.MemoryBytes, layout.BlockBytes())
		}
	}
	if n <= 0 {
		return nil, fmt.Errorf("kvcache: pool needs a positive number of blocks or bytes (got %d blocks, %d bytes)", cfg.NumBlocks, cfg.MemoryBytes)
	}
	if n > 1<<31-1 {
		return nil, fmt.Errorf("kvcache: %d blocks exceed the block id range", n)
	}
	m, err := createMapping(cfg.Dir, layout, n)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		m:        m,
		extraKey: []byte(cfg.ExtraKey),
		blocks:   make([]blockMeta, n),
		free:     list{-1, -1},
		cached:   list{-1, -1},
		cache:    make(map[BlockHash]int32),
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = -1, -1
		p.push(&p.free, int32(i), inFree)
	}
	return p, nil
}

// Close unmaps the memory and unlinks the pool file. The pool must not be
// used afterwards; readers that attached keep their own mapping.
func (p *Pool) Close() error { return p.m.close(true) }

// Path is the pool file's path, for a same-host reader (see Attach).
func (p *Pool) Path() string { return p.m.path }

// FileOffsets returns where the blocks and the generation counters start in
// the pool file, for a same-host reader that maps the file itself (block i
// at blocks + i*BlockBytes, its generation the uint64 at generations + 8*i).
func (p *Pool) FileOffsets() (blocks, generations int64) {
	_, genOff := fileSize(p.m.layout, p.m.n)
	return headerSize, genOff
}

// Layout returns the KV layout of the blocks.
func (p *Pool) Layout() model.KVLayout { return p.m.layout }

// NumBlocks returns the number of blocks in the pool.
func (p *Pool) NumBlocks() int { return p.m.n }

// BlockSize returns the number of token slots per block.
func (p *Pool) BlockSize() int { return p.m.layout.BlockSize }

// Data returns the whole block region (the pool argument of model.Forward:
// Layout().Offset indexes it in elements of Layout().DType). It starts
// page-aligned.
func (p *Pool) Data() []byte { return p.m.data }

// BlockBytes returns the memory of block id. It panics if id is out of range,
// like a slice index: ids come from the pool itself.
func (p *Pool) BlockBytes(id int32) []byte { return p.m.blockBytes(id) }

// Generation returns how many times block id has been taken from the free
// list to hold new content. It is safe to call from any goroutine.
func (p *Pool) Generation(id int32) uint64 { return p.m.generation(id) }

// FreeBlocks returns the number of blocks with no reference, cached or not:
// the number a caller can allocate now.
func (p *Pool) FreeBlocks() int { return p.numFree }

// Usage is the fraction of blocks in use (vllm:kv_cache_usage_perc).
func (p *Pool) Usage() float64 { return 1 - float64(p.numFree)/float64(p.m.n) }

// RefCount returns the number of holders of block id.
func (p *Pool) RefCount(id int32) int { return int(p.blocks[id].ref) }

// Cached reports whether block id is registered in the prefix cache.
func (p *Pool) Cached(id int32) bool { return p.blocks[id].hashed }

// NumCachedBlocks returns the number of blocks registered in the prefix cache.
func (p *Pool) NumCachedBlocks() int { return len(p.cache) }

// HashBlock returns the hash of a full block holding tokens whose preceding
// blocks hash to parent (the zero BlockHash for the first block).
func (p *Pool) HashBlock(parent BlockHash, tokens []int32) BlockHash {
	h := sha256.New()
	h.Write(parent[:])
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(len(tokens)))
	h.Write(b[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	h.Write(p.extraKey)
	var out BlockHash
	h.Sum(out[:0])
	return out
}

// ExtendHashes appends to hashes the hashes of the full blocks of tokens
// that hashes does not cover yet, and returns the extended slice. hashes must
// be the hashes of the first len(hashes) blocks of tokens.
func (p *Pool) ExtendHashes(hashes []BlockHash, tokens []int32) []BlockHash {
	bs := p.m.layout.BlockSize
	for i := len(hashes); (i+1)*bs <= len(tokens); i++ {
		var parent BlockHash
		if i > 0 {
			parent = hashes[i-1]
		}
		hashes = append(hashes, p.HashBlock(parent, tokens[i*bs:(i+1)*bs]))
	}
	return hashes
}

// Match returns the blocks caching the longest prefix of hashes, without
// taking references (see Touch).
func (p *Pool) Match(hashes []BlockHash) []int32 {
	var ids []int32
	for _, h := range hashes {
		id, ok := p.cache[h]
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return ids
}

// RecordPrefixQuery counts one prefix-cache lookup of queried tokens of which
// hit were found (vllm:prefix_cache_queries and _hits).
func (p *Pool) RecordPrefixQuery(queried, hit int) {
	p.prefixQueries += uint64(queried)
	p.prefixHits += uint64(hit)
}

// PrefixStats returns the totals recorded by RecordPrefixQuery, in tokens.
func (p *Pool) PrefixStats() (queries, hits uint64) { return p.prefixQueries, p.prefixHits }

// Touch takes a reference on each block in ids (cache hits), taking free
// cached blocks off the free list.
func (p *Pool) Touch(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		if b.ref == 0 {
			p.unlink(id)
		}
		b.ref++
	}
}

// Allocate takes n blocks for new content, uncached free blocks first, then
// the least recently freed cached blocks (evicting them from the cache). Each
// block gets one reference and a new generation. It returns false and
// changes nothing when fewer than n blocks are free.
func (p *Pool) Allocate(n int) ([]int32, bool) {
	if n < 0 || n > p.numFree {
		return nil, false
	}
	ids := make([]int32, 0, n)
	for range n {
		l := &p.free
		if l.head < 0 {
			l = &p.cached
		}
		id := l.head
		p.unlink(id)
		b := &p.blocks[id]
		if b.hashed {
			delete(p.cache, b.hash)
			b.hashed = false
		}
		b.ref = 1
		atomic.AddUint64(&p.m.gens[id], 1)
		ids = append(ids, id)
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
func (p *Pool) Free(ids []int32) error {
	var bad []int32
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if id < 0 || int(id) >= len(p.blocks) || p.blocks[id].ref <= 0 {
			bad = append(bad, id)
			continue
		}
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			if b.hashed {
				p.push(&p.cached, id, inCached)
			} else {
				p.push(&p.free, id, inFree)
			}
		}
	}
	if bad != nil {
		return fmt.Errorf("%w: blocks %v", ErrNotHeld, bad)
	}
	return nil
}

// Cache registers block id, whose KV for a full block of tokens is complete,
// under hash. It returns false and changes nothing when another block already
// caches hash (the duplicate stays private to its holder) or when id is
// already registered.
func (p *Pool) Cache(id int32, hash BlockHash) bool {
	b := &p.blocks[id]
	if b.hashed {
		return false
	}
	if _, dup := p.cache[hash]; dup {
		return false
	}
	b.hashed, b.hash = true, hash
	p.cache[hash] = id
	if b.list == inFree { // freed before being cached: keep the list honest
		p.unlink(id)
		p.push(&p.cached, id, inCached)
	}
	return true
}

// Uncache removes block id from the prefix cache (its content turned out to
// be invalid), so nobody can hit it again.
func (p *Pool) Uncache(id int32) {
	b := &p.blocks[id]
	if !b.hashed {
		return
	}
	delete(p.cache, b.hash)
	b.hashed = false
	if b.list == inCached {
		p.unlink(id)
		p.push(&p.free, id, inFree)
	}
}

func (p *Pool) push(l *list, id int32, kind int8) {
	b := &p.blocks[id]
	b.list, b.prev, b.next = kind, l.tail, -1
	if l.tail >= 0 {
		p.blocks[l.tail].next = id
	} else {
		l.head = id
	}
	l.tail = id
	p.numFree++
}

func (p *Pool) unlink(id int32) {
	b := &p.blocks[id]
	l := &p.free
	if b.list == inCached {
		l = &p.cached
	}
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		l.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.list, b.prev, b.next = inUse, -1, -1
	p.numFree--
}
