package kvevents

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

func TestWireHashIsTheDigestsLastEightBytes(t *testing.T) {
	var h kvcache.BlockHash
	for i := range h {
		h[i] = byte(i)
	}
	if got, want := WireHash(h), uint64(0x18191a1b1c1d1e1f); got != want {
		t.Fatalf("WireHash = %#x, want %#x", got, want)
	}
}

func TestBlockHashesAreTheEnginesPrefixCacheKeys(t *testing.T) {
	b, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 4, NumBlocks: 8, ExtraKey: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	engine := b.ExtendHashes(nil, tokens)
	got := BlockHashes("fp", 4, tokens)
	if len(got) != 2 || len(engine) != 2 {
		t.Fatalf("%d router hashes and %d engine hashes for 10 tokens in blocks of 4, want 2", len(got), len(engine))
	}
	for i := range got {
		if got[i] != WireHash(engine[i]) {
			t.Errorf("block %d: router hash %#x, engine %#x", i, got[i], WireHash(engine[i]))
		}
	}
	if other := BlockHashes("another model", 4, tokens); other[0] == got[0] {
		t.Error("another model's fingerprint gives the same hash")
	}
}
