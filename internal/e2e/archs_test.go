package e2e

import (
	"fmt"
	"testing"
)

// TestDisaggregatedArchitecturesMatchColocated runs the P/D equivalence
// check on the architectures beyond the Llama family: a random-weight Qwen3
// (per-head q/k norms, head_dim apart from hidden/heads) in bf16, so with a
// bf16 KV cache, a Qwen3-MoE (8 experts, top-2, a dense layer) in f32 and
// a Mixtral (4 experts, top-2, every layer sparse) in bf16 and a Gemma 3
// (local layers with a window of 19, shorter than most prompts here, and a
// global layer) in bf16 and a SmolLM3 (every 2nd layer without RoPE, those
// with a window of 13) and a Phi-4-mini-like Phi-3 (fused projections,
// partial rotary, longrope) in bf16.
// Through the proxy (prefill engine, KV pulled by a decode engine) every
// request must answer bit-identically to a colocated engine and take the
// P/D path.
func TestDisaggregatedArchitecturesMatchColocated(t *testing.T) {
	bin := tandem(t)
	requirePD(t, bin)
	const vocab = 1000 // below the tokenizer fixture's size
	for _, arch := range []struct{ shape, dtype string }{{"qwen3-tiny", "bf16"}, {"qwen3-moe-tiny", "f32"}, {"mixtral-tiny", "bf16"}, {"gemma3-tiny", "bf16"}, {"smollm3-tiny", "bf16"}, {"phi3-tiny", "bf16"}} {
		t.Run(arch.shape+" "+arch.dtype, func(t *testing.T) {
			model := t.TempDir()
			initModel := startProc(t, "model init", "model", "init", "--shape", arch.shape, "--dtype", arch.dtype, "--out", model)
			<-initModel.done
			if initModel.err != nil {
				t.Fatalf("tandem model init: %v\n%s", initModel.err, initModel.out.String())
			}
			ref := startEngine(t, engineSpec{name: "reference", model: model})
			prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill"})
			decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode"})
			proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})

			seed := uint64(0)
			for _, n := range []int{5, blockSize + 1, 3 * blockSize, 100} {
				for _, s := range samplings {
					for _, st := range streamings {
						seed++
						prompt := tokenPrompt(seed, n, vocab)
						t.Run(fmt.Sprintf("%d prompt tokens, %s, %s", n, s.name, st.name), func(t *testing.T) {
							body := completionBody(prompt, s, st.stream)
							want, _ := generate(t, ref.url, "/v1/completions", body)
							before := decodeCounters(t, decode)
							got, r := generate(t, proxy, "/v1/completions", body)
							if r.pd() != "remote" {
								t.Errorf("x-tandem-pd %q, want remote", r.pd())
							}
							sameGeneration(t, want, got)
							d := decodeCounters(t, decode).sub(before)
							checkPulled(t, d, want.PromptTokens, 0)
							if arch.shape == "gemma3-tiny" {
								checkClipped(t, d.bytes, n)
							}
						})
					}
				}
			}
			t.Run("chat", func(t *testing.T) {
				msgs := []map[string]any{
					{"role": "system", "content": "You are a helpful assistant."},
					{"role": "user", "content": "Tell me a story about " + arch.shape + "."},
				}
				body := chatBody(msgs, samplings[0], false)
				want, _ := generate(t, ref.url, "/v1/chat/completions", body)
				got, r := generate(t, proxy, "/v1/chat/completions", body)
				if r.pd() != "remote" {
					t.Errorf("x-tandem-pd %q, want remote", r.pd())
				}
				sameGeneration(t, want, got)
			})
			waitPoolsIdle(t, ref, prefill, decode)
		})
	}
}

// checkClipped fails t unless a gemma3-tiny decode pulled, for an n-token
// prompt (blocks of 16, the bf16 KV of 5 layers with 2 KV heads of 24),
// only the blocks of its hybrid KV cache's groups that the windows still
// see: every block of the global layer's group and, in each of the four
// sliding-window groups (window 19), the blocks from the 64-key chunk
// holding the last prompt token's window on. The one-group layout would
// pull every layer's block for every token.
func checkClipped(t *testing.T, pulled float64, n int) {
	t.Helper()
	const layerBlock = 2 * blockSize * 2 * 24 * 2 // K and V, 16 slots, 2 KV heads of 24, bf16
	nb := (n - 1 + blockSize - 1) / blockSize     // the decode computes the last prompt token
	first := max(n-1-19+1, 0) / 64 * 64 / blockSize
	want := float64((nb + 4*(nb-first)) * layerBlock)
	if pulled != want {
		t.Errorf("decode pulled %v bytes, want %v (clipped; the one-group layout moves %v)", pulled, want, float64(nb*5*layerBlock))
	}
}
