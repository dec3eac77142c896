package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestGGUFQwen3RoundTrips converts the transformers-built Qwen3, Qwen3-MoE
// and Mixtral (as llama with experts) checkpoints to GGUF and loads them back: as f32, the logits
// are the checkpoint's bit for bit (q/k norms, router and stacked experts
// named, laid out and sliced right; the sparse layers and the top-k
// normalisation recovered from the file); as q8_0, close to them.
func TestGGUFQwen3RoundTrips(t *testing.T) {
	for _, name := range hfCases {
		if !strings.HasPrefix(name, "qwen3/") && name != "mixtral/mixtral-top2" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			want := loadTestModel(t, dir, 2)
			path := convertGGUF(t, dir, "f32")
			got := loadTestModel(t, path, 2)

			wc, gc := want.Config(), got.Config()
			if gc.ModelType != wc.ModelType || gc.QKNorm != wc.QKNorm || gc.HeadDim != wc.HeadDim || gc.TieWordEmbeddings != wc.TieWordEmbeddings {
				t.Errorf("GGUF config %+v, checkpoint's %+v", gc, wc)
			}
			if gc.MoE.Experts != wc.MoE.Experts || gc.MoE.TopK != wc.MoE.TopK || gc.MoE.Intermediate != wc.MoE.Intermediate || gc.MoE.NormTopK != wc.MoE.NormTopK {
				t.Errorf("GGUF MoE %+v, checkpoint's %+v", gc.MoE, wc.MoE)
			}
			for i := range wc.Layers {
				if gc.SparseLayer(i) != wc.SparseLayer(i) {
					t.Errorf("layer %d: sparse %t in the GGUF file, %t in the checkpoint", i, gc.SparseLayer(i), wc.SparseLayer(i))
				}
			}
			if got.NumParams() != want.NumParams() {
				t.Errorf("params %d, want %d", got.NumParams(), want.NumParams())
			}
			if wc.MoE.Experts > 0 {
				f, err := gguf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				for l := range wc.Layers {
					if !wc.SparseLayer(l) {
						continue
					}
					exps, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_down_exps.weight", l))
					if !ok || len(exps.Dims) != 3 || exps.Dims[2] != int64(wc.MoE.Experts) {
						t.Errorf("layer %d: ffn_down_exps %+v (present %t), want 3 dimensions, %d experts last", l, exps, ok, wc.MoE.Experts)
					}
					router, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l))
					if !ok || router.Type != gguf.F32 {
						t.Errorf("layer %d: ffn_gate_inp %+v (present %t), want F32", l, router, ok)
					}
				}
			}

			r := rand.New(rand.NewPCG(5, 6))
			tokens := randomTokens(r, 40, wc.Vocab)
			a, b := logitsOf(t, got, tokens), logitsOf(t, want, tokens)
			for p := range b {
				if !sameBits(a[p], b[p]) {
					t.Fatalf("position %d: f32 GGUF logits differ from the checkpoint's (max rel diff %g)", p, relDiff(a, b))
				}
			}
		})
	}
}

// kquantMoESpec is a Qwen3-MoE wide enough for the K-quants (256-weight
// blocks): 8 experts, top-2, the first layer dense.
func kquantMoESpec() modelinit.Spec {
	return testSpec(func(s *modelinit.Spec) {
		s.ModelType, s.Hidden, s.Heads, s.KVHeads, s.HeadDim, s.Intermediate, s.Layers, s.Tied, s.Std = "qwen3_moe", 256, 4, 2, 64, 256, 3, true, 0.02
		s.MoE = modelinit.MoE{Experts: 8, TopK: 2, Intermediate: 256, NormTopK: true, DenseLayers: []int{0}}
	})
}

// TestGGUFQwen3MoEQuantized converts a Qwen3-MoE to quantized GGUF files:
// the stacked experts are quantized row by row like any matrix (ffn_down_exps
// taking Q6_K where llama.cpp's mix gives ffn_down more bits), the router
// stays F32, and the logits stay near the f32 checkpoint's. Routing is
// discontinuous: a token whose second and third experts nearly tie can
// switch expert under the quantization error and move further (here 2 of
// 24 positions at q8_0, by up to 0.07 of the largest logit). So most
// positions must be within the bounds TestGGUFQuantizedNearTwins sets for
// dense models, and every one within a wider bound.
func TestGGUFQwen3MoEQuantized(t *testing.T) {
	spec := kquantMoESpec()
	dir := writeTestModel(t, spec)
	ref := loadTestModel(t, dir, 2)
	tokens := randomTokens(rand.New(rand.NewPCG(7, 8)), 24, spec.Vocab)
	want := logitsOf(t, ref, tokens)
	var scale float64
	for _, row := range want {
		for _, v := range row {
			scale = max(scale, math.Abs(float64(v)))
		}
	}
	for _, c := range []struct {
		enc          string
		bound, worst float64
	}{{"q8_0", 0.02, 0.15}, {"q4_k_m", 0.1, 0.25}} {
		m := loadTestModel(t, convertGGUF(t, dir, c.enc), 2)
		got := logitsOf(t, m, tokens)
		within, worst := 0, 0.0
		for p := range want {
			d := 0.0
			for j := range want[p] {
				d = max(d, math.Abs(float64(got[p][j]-want[p][j])))
			}
			d /= scale
			worst = max(worst, d)
			if d <= c.bound {
				within++
			}
		}
		t.Logf("%s: %d/%d positions within %g of the largest logit, worst %.4f", c.enc, within, len(want), c.bound, worst)
		if within < len(want)*9/10 || worst > c.worst {
			t.Errorf("%s: %d/%d positions within %g (want 90%%), worst %.4f (want at most %g)", c.enc, within, len(want), c.bound, worst, c.worst)
		}
		l := m.layers[1].moe
		if l == nil || l.router.DType != tensor.F32 {
			t.Fatalf("%s: layer 1 router %+v, want an F32 matrix", c.enc, l)
		}
		wantGate := map[string]tensor.DType{"q8_0": tensor.Q8_0, "q4_k_m": tensor.Q4_K}[c.enc]
		if dt := l.experts[7].gateUp.mats[0].DType; dt != wantGate {
			t.Errorf("%s: expert gate %s, want %s", c.enc, dt, wantGate)
		}
		if c.enc == "q4_k_m" {
			// use_more_bits of 3 layers: the last eighth (i ≥ 21/8 = 2).
			if dt := m.layers[2].moe.experts[0].down.DType; dt != tensor.Q6_K {
				t.Errorf("q4_k_m: layer 2 ffn_down_exps %s, want Q6_K", dt)
			}
			if dt := m.layers[1].moe.experts[0].down.DType; dt != tensor.Q4_K {
				t.Errorf("q4_k_m: layer 1 ffn_down_exps %s, want Q4_K", dt)
			}
		}
	}
}
