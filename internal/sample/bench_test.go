package sample

import (
	"testing"
)

// BenchmarkSample measures one Sample call over a 49152-token vocabulary
// (SmolLM/StarCoder size) with logits drawn from N(0, 2.5²), roughly the
// spread of a small trained model's logits, for each sampling path: greedy,
// temperature alone, top-k, top-p, min-p and penalties, with 5 logprobs
// unless the case says no_logprobs. Besides wall time it reports the
// process CPU time per call, which is steadier on a shared machine, and the
// allocations (only the returned Logprob, in steady state).
//
// These logits are flatter than a trained model's usually are, so top-p's
// nucleus is large: 1148 tokens at temperature 0.8 and top_p 0.9, 8889
// tokens at temperature 1 and top_p 0.95 (the case a client sending only
// top_p gets), which is top-p's slowest regime.
//
//	go test -run '^$' -bench Sample -benchtime 2000x ./internal/sample
func BenchmarkSample(b *testing.B) {
	const vocab = 49152
	logits := randomLogits(1, vocab, 2.5)
	output := make([]int32, 200)
	for i := range output {
		output[i] = int32(i * 7)
	}
	prompt := make([]int32, 1000)
	for i := range prompt {
		prompt[i] = int32(i * 13 % vocab)
	}
	tests := []struct {
		name string
		p    Params
	}{
		{"greedy", Params{Logprobs: 5}},
		{"temperature", Params{Temperature: 0.8, Logprobs: 5}},
		{"top_p=0.9", Params{Temperature: 0.8, TopP: 0.9, Logprobs: 5}},
		{"top_k=50", Params{Temperature: 0.8, TopK: 50, Logprobs: 5}},
		{"top_k=50,top_p=0.9,min_p=0.05", Params{Temperature: 0.8, TopK: 50, TopP: 0.9, MinP: 0.05, Logprobs: 5}},
		{"greedy,no_logprobs", Params{Logprobs: -1}},
		{"top_p=0.9,no_logprobs", Params{Temperature: 0.8, TopP: 0.9, Logprobs: -1}},
		{"temperature,no_logprobs", Params{Temperature: 0.8, Logprobs: -1}},
		{"top_k=50,no_logprobs", Params{Temperature: 0.8, TopK: 50, Logprobs: -1}},
		{"min_p=0.05,no_logprobs", Params{Temperature: 0.8, MinP: 0.05, Logprobs: -1}},
		{"temperature=1,no_logprobs", Params{Temperature: 1, Logprobs: -1}},
		{"temperature=1,top_p=0.95,no_logprobs", Params{Temperature: 1, TopP: 0.95, Logprobs: -1}},
		{"penalties,top_p=0.9", Params{Temperature: 0.8, TopP: 0.9, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2, Logprobs: 5}},
	}
	for _, tc := range tests {
		b.Run(tc.name, func(b *testing.B) {
			s := NewSampler(new(seeded(tc.p, 1)), vocab, []int32{0})
			b.ReportAllocs()
			cpu0, ok := processCPU()
			for b.Loop() {
				s.Sample(logits, prompt, output)
			}
			if cpu1, _ := processCPU(); ok {
				b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/sample")
			}
		})
	}
}
