package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
)

// hfGolden is the golden.json that scripts/reference/transformers_goldens.py
// writes beside each checkpoint under testdata/<family>: transformers' logits for every
// prompt position and its greedy continuation.
type hfGolden struct {
	PromptIDs    []int32   `json:"prompt_ids"`
	Vocab        int       `json:"vocab"`
	Logits       []float64 `json:"logits"`
	GreedyIDs    []int32   `json:"greedy_ids"`
	Transformers string    `json:"transformers"`
}

// hfCases are the checkpoints under testdata, family/case, built by
// transformers (see scripts/reference/transformers_goldens.py for what each
// one exercises).
var hfCases = []string{
	"qwen3/qwen3-tied", "qwen3/qwen3-untied", "qwen3/qwen3moe-norm", "qwen3/qwen3moe-nonorm",
	"mixtral/mixtral-top2", "mixtral/mixtral-window",
	"mistral/mistral-window67", "mistral/qwen2-maxwindow",
	"gemma3/gemma3-tied", "gemma3/gemma3-long",
	"smollm3/smollm3-nope", "smollm3/smollm3-window",
	"phi3/phi3-partial", "phi3/phi4mini-longrope", "phi3/phi3-window",
	"llama/llama3-rope",
}

func loadHFGolden(t *testing.T, dir string) hfGolden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g hfGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Logits) != len(g.PromptIDs)*g.Vocab {
		t.Fatalf("golden.json: %d logits for %d positions of %d", len(g.Logits), len(g.PromptIDs), g.Vocab)
	}
	return g
}

// TestMatchesTransformers checks Tandem's forward pass against the logits
// Hugging Face transformers computed for the same f32 checkpoints (Qwen3
// with tied and untied heads and head_dim ≠ hidden/heads, Qwen3-MoE with
// normalised and unnormalised top-k weights and dense layers among the
// sparse ones, Mixtral with top-2 and top-3 routing and a sliding window
// smaller than the prompt, Mistral with a window of 67 over 72 tokens, Qwen2
// windowed from max_window_layers on, Gemma 3 with local and global layers,
// linear RoPE scaling and logit soft-capping, SmolLM3 with layers without
// RoPE, one of them windowed, Phi-3 with fused projections and partial
// rotary embeddings, a window in every layer and Phi-4-mini's longrope,
// Llama with Llama 3.x RoPE scaling), position by position, and the greedy
// continuations. The checkpoints are those committed under testdata, or with
// TANDEM_HF_REFERENCE those scripts/reference/check.sh has just made.
//
// The tolerance: both sides compute in f32 but sum in different orders
// (and transformers' matmuls block differently), so logits differ by a few
// f32 rounding steps of the values summed, which through three layers of
// width 32–48 is ~1e-6 of the logit scale; 1e-4 of the largest |logit|
// leaves a wide margin while catching any real error (a misplaced norm,
// a wrong expert or weight moves logits by ~1e-2 of the scale and more).
func TestMatchesTransformers(t *testing.T) {
	for _, name := range hfCases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			if live := os.Getenv("TANDEM_HF_REFERENCE"); live != "" {
				// scripts/reference/check.sh: checkpoints and goldens
				// just made by transformers.
				dir = filepath.Join(live, name)
			}
			g := loadHFGolden(t, dir)
			for _, threads := range []int{1, 2} {
				m := loadTestModel(t, dir, threads)
				if m.VocabSize() != g.Vocab {
					t.Fatalf("vocab %d, golden has %d", m.VocabSize(), g.Vocab)
				}
				layout := m.KVLayoutOf(4, kvlayout.F32)
				kv, blocks := contiguous(layout, len(g.GreedyIDs))
				out, err := m.Forward([]Seq{{Tokens: g.PromptIDs, Blocks: blocks, Logits: allIndexes(len(g.PromptIDs))}}, kv, layout)
				if err != nil {
					t.Fatal(err)
				}
				scale := 0.0
				for _, v := range g.Logits {
					scale = max(scale, math.Abs(v))
				}
				worst, at := 0.0, 0
				for i, want := range g.Logits {
					if d := math.Abs(float64(out[0][i]) - want); d > worst {
						worst, at = d, i
					}
				}
				t.Logf("threads=%d: max |logit - transformers %s| = %.3g at position %d (logit scale %.3g)",
					threads, g.Transformers, worst, at/g.Vocab, scale)
				if worst > 1e-4*scale {
					t.Errorf("threads=%d: logit %d of position %d = %v, transformers %v: off by %.3g, more than 1e-4 of the logit scale %.3g",
						threads, at%g.Vocab, at/g.Vocab, out[0][at], g.Logits[at], worst, scale)
				}
				ids := slices.Clone(g.PromptIDs)
				pos := len(ids)
				next := argmax(out[0][(pos-1)*g.Vocab:])
				for len(ids) < len(g.GreedyIDs) {
					ids = append(ids, next)
					if len(ids) == len(g.GreedyIDs) {
						break
					}
					out, err := m.Forward([]Seq{{Tokens: []int32{next}, Pos: pos, Blocks: blocks, Logits: []int{0}}}, kv, layout)
					if err != nil {
						t.Fatal(err)
					}
					pos++
					next = argmax(out[0])
				}
				if !slices.Equal(ids, g.GreedyIDs) {
					t.Errorf("threads=%d: greedy ids %v, transformers %v", threads, ids, g.GreedyIDs)
				}
			}
		})
	}
}
