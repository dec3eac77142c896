package model

import (
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/modelinit"
)

// testGemmaGGUFSpec is a Gemma 3 that a gemma3 GGUF file can describe:
// every 6th layer global, local RoPE base 10000, query_pre_attn_scalar =
// head_dim.
func testGemmaGGUFSpec(dtype string) modelinit.Spec {
	return testSpec(func(s *modelinit.Spec) {
		s.ModelType, s.DType, s.Layers, s.Tied = "gemma3_text", dtype, 7, true
		s.SlidingWindow = 9
		s.RopeScaling = modelinit.RopeScaling{Type: "linear", Factor: 8}
		s.Gemma = modelinit.Gemma{Pattern: 6, LocalRopeTheta: 10000, QueryScalar: 16}
	})
}

// TestGGUFGemma3RoundTrips converts a Gemma 3 (local and global layers,
// linear RoPE scaling of the global ones) to an f32 gemma3 GGUF file and
// loads it back: the configuration comes back and the logits are the
// checkpoint's bit for bit (norms stored as 1 + w as llama.cpp stores
// them, the sandwich norms named and bound right, the window kept).
func TestGGUFGemma3RoundTrips(t *testing.T) {
	spec := testGemmaGGUFSpec("f32")
	dir := writeTestModel(t, spec)
	want := loadTestModel(t, dir, 2)
	path := convertGGUF(t, dir, "f32")
	got := loadTestModel(t, path, 2)
	wc, gc := want.Config(), got.Config()
	if gc.ModelType != "gemma3_text" || gc.SlidingWindow != wc.SlidingWindow || gc.Gemma != wc.Gemma ||
		!reflect.DeepEqual(gc.RopeScaling, wc.RopeScaling) || gc.RopeTheta != wc.RopeTheta || len(gc.FullLayers) != 1 || gc.FullLayers[0] != 5 || gc.MaxModelLen() != wc.MaxModelLen() {
		t.Errorf("GGUF config %+v, checkpoint's %+v", gc, wc)
	}
	if got.NumParams() != want.NumParams() {
		t.Errorf("params %d, want %d", got.NumParams(), want.NumParams())
	}
	tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), 40, wc.Vocab)
	a, b := logitsOf(t, got, tokens), logitsOf(t, want, tokens)
	for p := range b {
		if !sameBits(a[p], b[p]) {
			t.Fatalf("position %d: f32 GGUF logits differ from the checkpoint's (max rel diff %g)", p, relDiff(a, b))
		}
	}
}

// TestGGUFGemma3RefusesWhatLlamaCppAssumesOtherwise checks that a Gemma 3
// whose layer pattern, local RoPE base or attention scale a gemma3 file
// cannot state is refused rather than written.
func TestGGUFGemma3RefusesWhatLlamaCppAssumesOtherwise(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*modelinit.Spec)
		want string
	}{
		"pattern 3":        {func(s *modelinit.Spec) { s.Gemma.Pattern = 3 }, "every 6th layer"},
		"local base 20000": {func(s *modelinit.Spec) { s.Gemma.LocalRopeTheta = 20000 }, "local RoPE base"},
		"query scalar 20":  {func(s *modelinit.Spec) { s.Gemma.QueryScalar = 20 }, "query_pre_attn_scalar"},
	} {
		t.Run(name, func(t *testing.T) {
			spec := testGemmaGGUFSpec("f32")
			tc.mod(&spec)
			dir := writeTestModel(t, spec)
			_, err := ConvertToGGUF(dir, io.Discard, GGUFOptions{Encoding: "f32"})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "safetensors") {
				t.Fatalf("ConvertToGGUF: %v, want an error about %q", err, tc.want)
			}
		})
	}
}
