package kvevents

import (
	"crypto/sha256"
	"encoding/binary"
)

// VLLMDefaultHashSeed is the seed vLLM derives its first block's parent hash
// (NONE_HASH) from when PYTHONHASHSEED is unset and its prefix-caching hash
// algorithm is cryptographic (sha256, sha256_cbor): DEFAULT_NONE_HASH_SEED in
// vllm/v1/core/kv_cache_utils.py (vLLM 0.32).
const VLLMDefaultHashSeed = "vllm-none-hash"

// VLLMBlockHashes returns the wire hashes of the full blocks of tokens as a
// vLLM engine started with `--prefix-caching-hash-algo sha256_cbor` computes
// and publishes them: block i's hash is SHA-256 over the canonical CBOR of
// the tuple (parent hash, block token ids, extra keys), the first parent
// being SHA-256 over the CBOR of seed (PYTHONHASHSEED, else
// VLLMDefaultHashSeed), and the wire form its last 8 bytes big-endian
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default). Extra keys are
// none (nil): no LoRA, multimodal input, cache salt or prompt embeddings. A
// partial last block has no hash, as in vLLM.
//
// vLLM's default algorithm, sha256, hashes Python pickles instead; a router
// outside Python reproduces only sha256_cbor (llm-d's indexer asks the same).
func VLLMBlockHashes(seed string, blockSize int, tokens []int32) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	var buf []byte
	buf = cborHead(buf, 3, uint64(len(seed)))
	buf = append(buf, seed...)
	parent := sha256.Sum256(buf)
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	for i := range n {
		buf = buf[:0]
		buf = append(buf, 0x83) // an array of 3: vLLM's tuple
		buf = cborHead(buf, 2, uint64(len(parent)))
		buf = append(buf, parent[:]...)
		buf = cborHead(buf, 4, uint64(blockSize))
		for _, t := range tokens[i*blockSize : (i+1)*blockSize] {
			if t < 0 {
				buf = cborHead(buf, 1, uint64(-int64(t)-1))
			} else {
				buf = cborHead(buf, 0, uint64(t))
			}
		}
		buf = append(buf, 0xf6) // null: no extra keys
		parent = sha256.Sum256(buf)
		out[i] = binary.BigEndian.Uint64(parent[len(parent)-8:])
	}
	return out
}

// cborHead appends a CBOR item head of major type major and argument v in
// its shortest form, as canonical CBOR (RFC 8949 §4.2.1, cbor2's
// canonical=True) writes it.
func cborHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= 0xff:
		return append(b, m|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, m|27), v)
	}
}
