package kvevents

import "testing"

// TestVLLMBlockHashesEqualVLLMs checks VLLMBlockHashes against hashes vLLM
// 0.32's own functions computed (vllm.utils.hashing.sha256_cbor chained as
// hash_block_tokens does, with init_none_hash's seed, folded as
// maybe_convert_block_hash folds them), for token ids whose CBOR heads take
// one, two, three and five bytes (the heads' widths are checked by TestCBORHeadIsShortest).
func TestVLLMBlockHashesEqualVLLMs(t *testing.T) {
	tokens := make([]int32, 70)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	tokens[5], tokens[6], tokens[7] = 300, 70000, 23
	for _, c := range []struct {
		seed string
		want []uint64
	}{
		{VLLMDefaultHashSeed, []uint64{0xc14f512362d32d30, 0xae9f64fb05ff772e}},
		{"42", []uint64{0xcf6dd1a36b6752b8, 0xb140867e3a3d3009}},
	} {
		got := VLLMBlockHashes(c.seed, 32, tokens)
		if len(got) != len(c.want) {
			t.Fatalf("seed %q: %d hashes for 70 tokens in blocks of 32, want %d (the partial block has none)", c.seed, len(got), len(c.want))
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("seed %q block %d: %#x, vLLM computes %#x", c.seed, i, got[i], c.want[i])
			}
		}
	}
}

// TestCBORHeadIsShortest checks the canonical (shortest) heads at each width's
// edges.
func TestCBORHeadIsShortest(t *testing.T) {
	for _, c := range []struct {
		v    uint64
		want []byte
	}{
		{23, []byte{0x17}}, {24, []byte{0x18, 24}}, {255, []byte{0x18, 0xff}},
		{256, []byte{0x19, 1, 0}}, {65536, []byte{0x1a, 0, 1, 0, 0}},
		{1 << 32, []byte{0x1b, 0, 0, 0, 1, 0, 0, 0, 0}},
	} {
		if got := cborHead(nil, 0, c.v); string(got) != string(c.want) {
			t.Errorf("head of %d: % x, want % x", c.v, got, c.want)
		}
	}
}
