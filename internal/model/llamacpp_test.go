package model

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestGGUFQwen3MatchesLlamaCpp checks Tandem's qwen3, qwen3moe, Mixtral, gemma3
// smollm3 and phi3 GGUF files against llama.cpp, an implementation Tandem did not write: the
// converter writes random f32 Qwen3, Qwen3-MoE, Mixtral, Gemma 3, SmolLM3 and Phi-3 checkpoints as GGUF, and
// llama.cpp's greedy continuation of a prompt (token ids) must equal
// Tandem's on the same file. llama.cpp runs through node-llama-cpp's
// prebuilt CPU binaries, installed by `npm ci` in
// scripts/reference/llamacpp; the test runs when TANDEM_LLAMACPP names that
// directory (scripts/reference/check.sh sets it) and is skipped otherwise.
//
// Greedy ids, not logits (node-llama-cpp hands out tokens): both sides
// compute in f32 (greedy.mjs asks for an f32 KV cache: with llama.cpp's
// default f16 one the MoE's routing flipped by the fourth token), and the
// weights' std of 0.15 spreads the logits so that no argmax is within f32
// rounding of a tie.
func TestGGUFQwen3MatchesLlamaCpp(t *testing.T) {
	ref := os.Getenv("TANDEM_LLAMACPP")
	if ref == "" {
		t.Skip("TANDEM_LLAMACPP is not set (scripts/reference/check.sh runs this test)")
	}
	script, err := filepath.Abs(filepath.Join(ref, "greedy.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's qwen3moe has every layer sparse and always normalises
	// the top-k weights.
	cases := map[string]modelinit.Spec{
		"qwen3": testSpec(func(s *modelinit.Spec) {
			s.ModelType, s.HeadDim, s.Tied, s.Vocab = "qwen3", 24, true, 512
		}),
		"qwen3_moe": testSpec(func(s *modelinit.Spec) {
			s.ModelType, s.HeadDim, s.Layers, s.Vocab = "qwen3_moe", 24, 3, 512
			s.MoE = modelinit.MoE{Experts: 8, TopK: 2, Intermediate: 32, NormTopK: true}
		}),
		// Gemma 3: six local layers with a window of 9 (shorter than the
		// 26 positions), a global one with linear RoPE scaling.
		"gemma3": func() modelinit.Spec {
			s := testGemmaGGUFSpec("f32")
			s.Vocab = 512
			return s
		}(),
		// Mixtral, written as llama with experts (q/k permuted).
		"mixtral": testSpec(func(s *modelinit.Spec) {
			s.ModelType, s.Layers, s.Vocab = "mixtral", 3, 512
			s.MoE = modelinit.MoE{Experts: 4, TopK: 2}
		}),
		// SmolLM3: layer 3 of 5 without RoPE (llama.cpp's every 4th),
		// q/k permuted as llama's, untied head.
		"smollm3": testSpec(func(s *modelinit.Spec) {
			s.ModelType, s.Layers, s.Vocab, s.RopeTheta = "smollm3", 5, 512, 2e6
		}),
		// Phi-4-mini's features: fused projections, RoPE on 12 of 16
		// dimensions, longrope (short factors within the original 1024
		// positions, the attention factor), tied head.
		"phi3": func() modelinit.Spec {
			s, _ := modelinit.Shape(modelinit.ShapePhi3Tiny, "f32")
			s.Vocab, s.Std, s.NormJitter, s.BOS, s.EOS = 512, 0.15, 0.3, 1, 2
			return s
		}(),
	}
	for name, spec := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			fx, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: spec.Vocab})
			if err != nil {
				t.Fatal(err)
			}
			spec.BOS, spec.EOS = fx.BOS, fx.EOS
			if err := modelinit.Write(dir, spec, 11); err != nil {
				t.Fatal(err)
			}
			meta, err := tokenizer.GGUFMetadata(dir, spec.Vocab)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".gguf")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ConvertToGGUF(dir, f, GGUFOptions{Encoding: "f32", Metadata: meta}); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			m := loadTestModel(t, path, 2)
			const n = 16
			prompt := []int32{17, 300, 42, 99, 256, 7, 180, 400, 3, 64}
			want := greedy(t, m, prompt, n)[len(prompt):]

			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // node starts slowly on a loaded host
			defer cancel()
			ids, _ := json.Marshal(prompt)
			cmd := exec.CommandContext(ctx, "node", script, path, string(ids), strconv.Itoa(n))
			cmd.Dir = ref
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("node greedy.mjs: %v\n%s", err, stderr)
			}
			var got []int32
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("llama.cpp printed %q: %v", out, err)
			}
			t.Logf("greedy ids: Tandem %v, llama.cpp %v", want, got)
			if !slices.Equal(got, want) {
				t.Errorf("llama.cpp's greedy ids %v differ from Tandem's %v", got, want)
			}
		})
	}
}
