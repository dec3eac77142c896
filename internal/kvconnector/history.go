package kvconnector

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// chainHashBytes is the length of one history hash (hex-encoded in params).
const chainHashBytes = 8

// historyChain hashes tokens block by block, each hash chained to the one
// before it and keyed by the model: entry i covers tokens[0 : min((i+1)·bs,
// len)]. A decode engine sends it with a conversation hold; a turn-2
// prefill compares it with its own prompt's chain, so it pulls only KV whose
// tokens are its prompt's prefix. A client that rewrote the history (vLLM
// #43094 computes wrong KV then) gets the mismatched blocks recomputed.
func historyChain(model string, tokens []int32, blockSize int) []string {
	var out []string
	prev := sha256.Sum256([]byte("tandem kv history\x00" + model))
	buf := make([]byte, 0, 4*blockSize+len(prev))
	for start := 0; start < len(tokens); start += blockSize {
		end := min(start+blockSize, len(tokens))
		buf = append(buf[:0], prev[:]...)
		for _, t := range tokens[start:end] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		prev = sha256.Sum256(buf)
		out = append(out, hex.EncodeToString(prev[:chainHashBytes]))
	}
	return out
}

// chainDigest is what a signature covers of a chain.
func chainDigest(chain []string) string {
	if len(chain) == 0 {
		return ""
	}
	sum := sha256.Sum256([]byte(strings.Join(chain, ",")))
	return hex.EncodeToString(sum[:])
}

// matchedTokens is how many of prompt's first tokens the held history
// (numTokens tokens, chain) covers exactly: whole blocks while the chains
// agree, and the last, partial block only if the prompt has all of it.
func matchedTokens(model string, prompt []int32, numTokens int, chain []string, blockSize int) int {
	mine := historyChain(model, prompt[:min(numTokens, len(prompt))], blockSize)
	matched := 0
	for i := 0; i < len(mine) && i < len(chain); i++ {
		end := min((i+1)*blockSize, numTokens)
		if end > len(prompt) || mine[i] != chain[i] {
			break
		}
		matched = end
	}
	return matched
}
