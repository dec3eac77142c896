package kvcache

import (
	"fmt"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// DefaultBlockSize is the number of token slots per block when the
// configuration leaves it zero (vLLM's default).
const DefaultBlockSize = 16

// Config sizes a Pool. Exactly one of NumBlocks and MemoryBytes is needed;
// NumBlocks wins when both are set.
type Config struct {
	// Layout is the model's KV layout; Layout.BlockSize 0 means
	// DefaultBlockSize.
	Layout kvlayout.Layout
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

// Pool is the KV cache of one engine: its Memory and the Blocks accounting
// of that memory, wired so that every block Blocks.Allocate hands out has
// its generation bumped in Memory before anyone can write to it. It has the
// methods of both (NumBlocks is defined once, here); the scheduler gets the
// accounting alone (the Blocks field), the model and the KV connector the
// memory. All methods must be called from one goroutine, except Generation
// and the bytes of blocks handed to a transfer.
type Pool struct {
	*Memory
	*Blocks
}

// New creates a pool and its shared memory file. Close releases both.
func New(cfg Config) (*Pool, error) {
	layout := cfg.Layout
	if layout.BlockSize == 0 {
		layout.BlockSize = DefaultBlockSize
	}
	one, err := geometryFor(layout, 1) // validates the layout before it sizes anything
	if err != nil {
		return nil, fmt.Errorf("kvcache: %w", err)
	}
	n := cfg.NumBlocks
	if n == 0 && cfg.MemoryBytes > 0 {
		n64 := min(cfg.MemoryBytes/int64(one.BlockBytes), maxBlocks)
		n = int(n64)
		if n == 0 {
			return nil, fmt.Errorf("kvcache: %d bytes of KV-cache memory hold no block of %d bytes: raise --kv-cache-memory or lower --block-size", cfg.MemoryBytes, one.BlockBytes)
		}
	}
	if n <= 0 {
		return nil, fmt.Errorf("kvcache: pool needs a positive number of blocks or bytes (got %d blocks, %d bytes)", cfg.NumBlocks, cfg.MemoryBytes)
	}
	mem, err := NewMemory(cfg.Dir, layout, n)
	if err != nil {
		return nil, err
	}
	blocks, err := NewBlocks(BlocksConfig{BlockSize: layout.BlockSize, NumBlocks: n, ExtraKey: cfg.ExtraKey, OnAllocate: mem.BumpGenerations})
	if err != nil {
		mem.Close()
		return nil, err
	}
	return &Pool{Memory: mem, Blocks: blocks}, nil
}

// NumBlocks returns the number of blocks in the pool.
func (p *Pool) NumBlocks() int { return p.Blocks.NumBlocks() }
