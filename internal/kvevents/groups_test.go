package kvevents

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

// TestGroupEventsRoundTrip checks that events with a KV-cache group encode
// group_idx (and a store its kv_cache_spec) in both encodings, in vLLM's
// field order, and decode back.
func TestGroupEventsRoundTrip(t *testing.T) {
	b := &Batch{TS: 2, HasRank: true, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{9}, Tokens: []int32{1, 2}, BlockSize: 2, Medium: MediumGPU, Group: 0, HasGroup: true},
		{Kind: BlockStored, Hashes: []uint64{9}, Tokens: []int32{1, 2}, BlockSize: 2, Medium: MediumGPU, Group: 3, HasGroup: true, Window: 512},
		{Kind: BlockRemoved, Hashes: []uint64{9}, Medium: MediumGPU, Group: 3, HasGroup: true},
	}}
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		got, err := DecodeBatch(AppendBatch(nil, b, enc))
		if err != nil {
			t.Fatalf("encoding %v: %v", enc, err)
		}
		if diff := cmp.Diff(b, got); diff != "" {
			t.Errorf("encoding %v round trip (-sent +decoded):\n%s", enc, diff)
		}
	}
}

// TestPublisherReportsGroups checks that a publisher told of hybrid
// KV-cache groups publishes every group's stores and removals with their
// group, while the index keeps group 0's blocks and matches by every
// group's; untold, it reports group 0 without a group, as before.
func TestPublisherReportsGroups(t *testing.T) {
	p, err := NewPublisher(Config{Endpoint: "tcp://127.0.0.1:0"}, PublisherOptions{BlockSize: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer p.shutdown(false, 0)
	blocks, err := kvcache.NewBlocks(kvcache.BlocksConfig{BlockSize: 2, NumBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	p.SetGroupWindows([]int{0, 8})
	blocks.SetObserver(p)
	h := blocks.ExtendHashes(nil, []int32{5, 6})
	ids, _ := blocks.Allocate(2)
	blocks.CacheGroup(0, ids[0], h[0])
	blocks.CacheGroup(1, ids[1], h[0])
	blocks.Uncache(ids[1])
	want := []Event{
		{Kind: BlockStored, Hashes: []uint64{WireHash(h[0])}, Tokens: []int32{5, 6}, BlockSize: 2, Medium: MediumGPU, HasGroup: true},
		{Kind: BlockStored, Hashes: []uint64{WireHash(h[0])}, Tokens: []int32{5, 6}, BlockSize: 2, Medium: MediumGPU, Group: 1, HasGroup: true, Window: 8},
		{Kind: BlockRemoved, Hashes: []uint64{WireHash(h[0])}, Medium: MediumGPU, Group: 1, HasGroup: true},
	}
	if diff := cmp.Diff(want, p.pending); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	x := NewIndex()
	x.Apply("e", &Batch{Events: p.pending})
	if n := x.Blocks("e"); n != 1 {
		t.Errorf("the index holds %d blocks of group 0: group 1's removal must not drop group 0's block", n)
	}
	if hits := x.Match([]uint64{WireHash(h[0])}, nil); len(hits) != 0 {
		t.Errorf("index hits %v: the engine cannot use the block, its sliding group 1 lost it inside the window", hits)
	}
	p.pending = nil

	p.SetGroupWindows(nil)
	blocks.CacheGroup(1, ids[1], h[0])
	if len(p.pending) != 0 {
		t.Errorf("a publisher not told of groups reported group 1: %+v", p.pending)
	}
}
