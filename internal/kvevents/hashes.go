package kvevents

import (
	"encoding/binary"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

// WireHash is a Tandem block hash as it goes on the wire: its last 8 bytes
// read big-endian, which is what vLLM publishes for its own 32-byte block
// hashes by default (maybe_convert_block_hash in
// vllm/v1/core/kv_cache_utils.py, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)
// and what llm-d's and Dynamo's indexers key on.
func WireHash(h kvcache.BlockHash) uint64 {
	return binary.BigEndian.Uint64(h[len(h)-8:])
}

// BlockHashes returns the wire hashes (WireHash) of the full blocks of
// tokens as an engine serving the model with this fingerprint
// (engine.Forwarder.Fingerprint, the prefix cache's extra key) and block size
// computes them: what a router looks up in an Index. A partial last block
// has no hash, as in the engine.
func BlockHashes(fingerprint string, blockSize int, tokens []int32) []uint64 {
	full := kvcache.BlockHashes(fingerprint, blockSize, nil, tokens)
	out := make([]uint64, len(full))
	for i, h := range full {
		out[i] = WireHash(h)
	}
	return out
}
