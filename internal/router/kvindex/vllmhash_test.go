package kvindex_test

import (
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
)

// TestVLLMFingerprintHashesAsVLLM checks that a "vllm:sha256_cbor"
// fingerprint makes the index hash prompts as vLLM engines publish their
// blocks (with the default seed or PYTHONHASHSEED's), not as Tandem's
// engines do: before, the router looked vLLM's events up under Tandem's
// hashes and never found a prefix hit.
func TestVLLMFingerprintHashesAsVLLM(t *testing.T) {
	ids := make([]int32, 64)
	for i := range ids {
		ids[i] = int32(i * 7)
	}
	for fp, seed := range map[string]string{"vllm:sha256_cbor": kvevents.VLLMDefaultHashSeed, "vllm:sha256_cbor:42": "42"} {
		if err := kvindex.CheckFingerprint(fp); err != nil {
			t.Fatalf("%s: %v", fp, err)
		}
		p := kvindex.New(fp, 32, nil)
		got := p.Hash(ids)
		p.Close()
		if want := kvevents.VLLMBlockHashes(seed, 32, ids); !slices.Equal(got, want) {
			t.Errorf("%s: hashes %x, want vLLM's %x", fp, got, want)
		}
		if tandem := kvevents.BlockHashes(fp, 32, ids); slices.Equal(got, tandem) {
			t.Errorf("%s: hashed as a Tandem engine would", fp)
		}
	}
	p := kvindex.New(fingerprint, 32, nil)
	defer p.Close()
	if got, want := p.Hash(ids), kvevents.BlockHashes(fingerprint, 32, ids); !slices.Equal(got, want) {
		t.Errorf("Tandem fingerprint: hashes %x, want %x", got, want)
	}
	for _, bad := range []string{"vllm:sha256", "vllm:xxhash_cbor"} {
		if err := kvindex.CheckFingerprint(bad); err == nil {
			t.Errorf("%s: accepted; vLLM's pickle and secret-seeded hashes cannot be reproduced", bad)
		}
	}
}
