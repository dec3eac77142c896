// Package kvcache owns the paged KV-cache memory of one engine and the
// accounting of its blocks: reference counts, a free list in LRU order, and
// prefix caching by chained block hashes, after vLLM v1's KV cache manager.
//
// The memory is a single shared file mapping (an anonymous memory file,
// memfd, reachable by other processes as /proc/<pid>/fd/<fd> while the
// engine lives, so even a SIGKILL leaves nothing behind) so that a decode engine
// on the same host can map a prefill engine's pool and copy blocks without a
// socket (see Attach). The file starts with a one-page header describing the
// layout, then the blocks (model.KVLayout: one block is one contiguous range
// across all layers), then one uint64 generation counter per block. A
// block's generation is bumped every time the block is taken from the free
// list to hold new content, so a reader that copies a block without holding
// it can detect that the block was reused under it:
//
//	g := pool.Generation(id)   // must equal the generation the owner published
//	copy(dst, pool.BlockBytes(id))
//	if pool.Generation(id) != g { /* the block was reused: discard dst */ }
//
// Prefix caching: a full block whose KV is completely computed is registered
// under hash(parent hash, the block's token ids, extra key), where the extra
// key is the model fingerprint, so two prompts sharing their first k full
// blocks share those blocks' KV. A block whose reference count drops to zero
// stays registered and goes to the free list; taking it for new content evicts
// it from the cache, touching it again for a prefix hit takes it back off the
// free list. Uncached free blocks are handed out before cached ones, and
// cached free blocks in least-recently-freed order.
//
// A Pool is not safe for concurrent use: one goroutine (the engine's step
// loop) owns it and starts none of its own. Only Generation and the bytes of
// blocks handed to a transfer may be read from other goroutines.
package kvcache
