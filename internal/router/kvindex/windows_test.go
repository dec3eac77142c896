package kvindex

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/kvevents"
)

// A hybrid engine whose only group slides (window 32 tokens, blocks of 16)
// holds the last two blocks of an 8-block prompt: vLLM's rule needs just
// those two for a whole hit; Tandem's needs the window's key chunk from
// block 4 on, so it has none.
func TestPreciseMatchesByTheEnginesWindowRule(t *testing.T) {
	for _, c := range []struct {
		fingerprint string
		want        int
	}{{"vllm:sha256_cbor", 8}, {"tandem-model", 0}} {
		p := New(c.fingerprint, 16, nil)
		p.idx.Apply("e", &kvevents.Batch{Events: []kvevents.Event{
			{Kind: kvevents.BlockStored, Hashes: []uint64{7, 8}, BlockSize: 16, HasGroup: true, Window: 32},
		}})
		got := 0
		p.Match([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, func(engine string, blocks int) { got = blocks })
		if got != c.want {
			t.Errorf("%s: %d blocks, want %d", c.fingerprint, got, c.want)
		}
		p.Close()
	}
}
