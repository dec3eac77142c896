package model

import (
	"testing"
	"time"
)

// BenchmarkDecodeLong decodes one token per Forward call for a single
// sequence after a 2,048-token prompt (context 2,048 to 2,303): decode at
// a long context, where each token's attention reads every key and value
// row of its sequence. Besides the mean it reports the fastest and the
// 10th-percentile token (reportLowTimes), which on a shared host are what
// a token costs when none of its threads was descheduled.
func BenchmarkDecodeLong(b *testing.B) {
	const ctx, span = 2048, 256
	for _, threads := range []int{1, 2} {
		runBench(b, threads, func(b *testing.B) {
			m := loadBench(b, threads)
			if ctx+span > m.cfg.MaxModelLen() {
				b.Skipf("model has %d positions", m.cfg.MaxModelLen())
			}
			layout := benchLayout(b, m)
			kv, blocks := contiguous(layout, ctx+span)
			prompt := make([]int32, ctx)
			for i := range prompt {
				prompt[i] = int32((i*7919 + 13) % m.VocabSize())
			}
			if _, err := m.Forward([]Seq{{Tokens: prompt, Blocks: blocks, Logits: []int{ctx - 1}}}, kv, layout); err != nil {
				b.Fatal(err)
			}
			tok := []int32{42}
			i := 0
			var each []time.Duration
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				seqs := []Seq{{Tokens: tok, Pos: ctx + i%span, Blocks: blocks, Logits: []int{0}}}
				out, err := m.Forward(seqs, kv, layout)
				if err != nil {
					b.Fatal(err)
				}
				tok[0] = argmax(out[0])
				each = append(each, time.Since(t0))
				i++
			}
			reportRates(b, b.N, cpuTime()-cpu0)
			reportLowTimes(b, each)
		})
	}
}
