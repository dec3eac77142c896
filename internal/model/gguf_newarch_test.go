package model

import (
	"io"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestGGUFSmolLM3RoundTrips converts the transformers-built SmolLM3 (every
// 4th layer without RoPE) to a smollm3 GGUF file and loads it back: the
// layers without RoPE are recovered from the architecture (llama.cpp's
// smollm3 has no key for them), the permuted q/k rows are permuted back,
// and the f32 logits are the checkpoint's bit for bit.
func TestGGUFSmolLM3RoundTrips(t *testing.T) {
	dir := filepath.Join("testdata", "smollm3", "smollm3-nope")
	want := loadTestModel(t, dir, 2)
	got := loadTestModel(t, convertGGUF(t, dir, "f32"), 2)
	wc, gc := want.Config(), got.Config()
	if gc.ModelType != "smollm3" || !slices.Equal(gc.NoRopeLayers, wc.NoRopeLayers) || !slices.Equal(gc.NoRopeLayers, []int{3}) {
		t.Errorf("GGUF model type %s, layers without RoPE %v; checkpoint's %s, %v (want [3])", gc.ModelType, gc.NoRopeLayers, wc.ModelType, wc.NoRopeLayers)
	}
	r := rand.New(rand.NewPCG(3, 4))
	tokens := randomTokens(r, 30, wc.Vocab)
	a, b := logitsOf(t, got, tokens), logitsOf(t, want, tokens)
	for p := range b {
		if !sameBits(a[p], b[p]) {
			t.Fatalf("position %d: f32 GGUF logits differ from the checkpoint's (max rel diff %g)", p, relDiff(a, b))
		}
	}
}

// TestGGUFSmolLM3RefusesOtherNoRopePatterns checks that a SmolLM3 whose
// layers without RoPE are not every 4th (llama.cpp's fixed pattern) is not
// written as a GGUF file that would run RoPE in the wrong layers.
func TestGGUFSmolLM3RefusesOtherNoRopePatterns(t *testing.T) {
	_, err := ConvertToGGUF(filepath.Join("testdata", "smollm3", "smollm3-window"), io.Discard, GGUFOptions{Encoding: "f32"})
	if err == nil || !strings.Contains(err.Error(), "every 4th") || !strings.Contains(err.Error(), "[1]") {
		t.Fatalf("ConvertToGGUF = %v, want an error naming the layers without RoPE and llama.cpp's every-4th pattern", err)
	}
}

// TestGGUFPhi3RoundTrips converts the transformers-built Phi-3 checkpoints
// (fused projections, partial rotary; Phi-4-mini's longrope) to phi3 GGUF
// files and loads them back: the fused attn_qkv and ffn_up, the rotary
// width (rope.dimension_count), the longrope factors (rope_factors_short,
// rope_factors_long) and attention factor come back, and the f32 logits
// are the checkpoint's bit for bit.
func TestGGUFPhi3RoundTrips(t *testing.T) {
	for _, name := range []string{"phi3/phi3-partial", "phi3/phi4mini-longrope"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			want := loadTestModel(t, dir, 2)
			got := loadTestModel(t, convertGGUF(t, dir, "f32"), 2)
			wc, gc := want.Config(), got.Config()
			if gc.ModelType != "phi3" || gc.RotaryDim != wc.RotaryDim || !reflect.DeepEqual(gc.RopeScaling, wc.RopeScaling) || gc.MaxModelLen() != wc.MaxModelLen() {
				t.Errorf("GGUF config %+v, checkpoint's %+v", gc, wc)
			}
			r := rand.New(rand.NewPCG(8, 9))
			tokens := randomTokens(r, 30, wc.Vocab)
			a, b := logitsOf(t, got, tokens), logitsOf(t, want, tokens)
			for p := range b {
				if !sameBits(a[p], b[p]) {
					t.Fatalf("position %d: f32 GGUF logits differ from the checkpoint's (max rel diff %g)", p, relDiff(a, b))
				}
			}
		})
	}
}
