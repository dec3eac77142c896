// Package kvcache owns the paged KV cache of one engine, in two halves that
// know nothing of each other, after vLLM v1's KV cache manager:
//
//   - Blocks is the accounting: reference counts, a free list in LRU order,
//     and prefix caching by chained block hashes. It is pure (no file, no
//     mapping, no unsafe, no clock), so the scheduler, which needs only the
//     accounting, is tested step by step without any memory, like etcd's
//     raft.
//   - Memory is the bytes: one shared memory file holding a header, the
//     blocks and one generation counter per block.
//
// Pool is the two wired together, for the engine (the model computes into
// Memory, the scheduler gets Pool.Blocks) and the KV connector (which reads
// blocks and generations).
//
// # Memory and generations
//
// The memory is a single shared file mapping (an anonymous memory file,
// memfd, reachable by other processes as /proc/<pid>/fd/<fd> while the
// engine lives, so even a SIGKILL leaves nothing behind; its size is sealed)
// so that a decode engine on the same host can map a prefill engine's pool
// and copy blocks without a socket (see Attach). The file starts with a
// one-page header describing the layout (Geometry), then the blocks
// (kvlayout.Layout: one block is one contiguous range across all layers),
// then one uint64 generation counter per block. A block's generation is
// bumped every time the block is taken from the free list to hold new
// content, so a reader that copies a block without holding it can detect
// that the block was reused under it:
//
//	g := pool.Generation(id)   // must equal the generation the owner published
//	copy(dst, pool.BlockBytes(id))
//	if pool.Generation(id) != g { /* the block was reused: discard dst */ }
//
// This seqlock needs the bump to happen before new content is written.
// Blocks.Allocate decides which blocks get new content, so it drives the
// bump through a hook: it calls BlocksConfig.OnAllocate with the ids it took
// before it returns them, and Pool sets that hook to Memory.BumpGenerations
// (an atomic increment). Nobody can write into a block before Allocate has
// returned its id, so the order holds by construction, whoever calls
// Allocate — the scheduler holds only the Blocks, never the Pool.
//
// # Prefix caching
//
// A full block whose KV is completely computed is registered under
// hash(parent hash, the block's token ids, extra key), where the extra key
// is the model fingerprint, so two prompts sharing their first k full blocks
// share those blocks' KV. A block whose reference count drops to zero stays
// registered and goes to the free list; taking it for new content evicts it
// from the cache, touching it again for a prefix hit takes it back off the
// free list (its content, and so its generation, unchanged). Uncached free
// blocks are handed out before cached ones, and cached free blocks in
// least-recently-freed order. In a pool of hybrid KV-cache groups
// (kvlayout.Grouped) each group caches its own blocks of the same tokens:
// the cache is keyed by (hash, group) (CacheGroup, MatchGroup, Lookup).
//
// # Reading another engine's pool
//
// Attach maps a pool file that the caller has opened read-only, after
// checking everything in it that a hostile or truncated file could lie
// about: the header's magic and version, a layout and block count whose
// sizes cannot overflow, block bytes and offsets that follow from them, a
// file size equal to what they need, and a geometry equal to the one the
// reader was told about. Every index into an Attached view is then inside
// the mapping, as long as the file is not truncated later, which a sealed
// memfd (Attached.Sealed) rules out.
//
// Blocks, Memory and Pool are not safe for concurrent use: one goroutine
// (the engine's step loop) owns them and starts none of its own. Only
// Generation and the bytes of blocks handed to a transfer may be read from
// other goroutines.
package kvcache
