package kvevents

import (
	"testing"
)

// benchBatch is a busy engine step: one request's 16 new blocks of 16
// tokens stored (with a parent), and 16 evicted blocks removed.
func benchBatch() *Batch {
	hashes := make([]uint64, 16)
	for i := range hashes {
		hashes[i] = 0x9e3779b97f4a7c15 * uint64(i+1)
	}
	tokens := make([]int32, 16*16)
	for i := range tokens {
		tokens[i] = int32(i * 997 % 32000)
	}
	return &Batch{TS: 1700000000.25, Events: []Event{
		{Kind: BlockStored, Hashes: hashes, Parent: 0x1234567890abcdef, HasParent: true, Tokens: tokens, BlockSize: 16, Medium: MediumGPU},
		{Kind: BlockRemoved, Hashes: hashes, Medium: MediumGPU},
	}, HasRank: true}
}

// benchBlocks is the number of block events in benchBatch (stored and
// removed blocks): the unit of the ~1 µs per block budget.
const benchBlocks = 32

// BenchmarkAppendBatch encodes benchBatch in each event encoding.
func BenchmarkAppendBatch(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			batch := benchBatch()
			buf := AppendBatch(nil, batch, enc)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendBatch(buf[:0], batch, enc)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchBlocks, "ns/block")
		})
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	payload := AppendBatch(nil, benchBatch(), EncodingMap)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatch(payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchBlocks, "ns/block")
}
