package modelinit

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

func TestInitTinyIsCompleteAndDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	spec, err := Init(a, ShapeTiny, "bf16", 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Init(b, ShapeTiny, "bf16", 5); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		da, err := os.ReadFile(filepath.Join(a, f))
		if err != nil {
			t.Fatal(err)
		}
		db, err := os.ReadFile(filepath.Join(b, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(da, db) {
			t.Errorf("%s differs between two runs with the same seed", f)
		}
	}
	tok, err := tokenizer.Load(a)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != spec.Vocab {
		t.Errorf("tokenizer has %d ids, model vocab is %d", tok.VocabSize(), spec.Vocab)
	}
	if eos := tok.EOS(); len(eos) != 1 || eos[0] != spec.EOS {
		t.Errorf("tokenizer EOS %v, model EOS %d", eos, spec.EOS)
	}
	c := t.TempDir()
	if _, err := Init(c, ShapeTiny, "bf16", 6); err != nil {
		t.Fatal(err)
	}
	wa, _ := os.ReadFile(filepath.Join(a, "model.safetensors"))
	wc, _ := os.ReadFile(filepath.Join(c, "model.safetensors"))
	if bytes.Equal(wa, wc) {
		t.Error("different seeds wrote the same weights")
	}
}

func TestWriteProducesTheSpecifiedTensors(t *testing.T) {
	for _, dtype := range []string{"f32", "bf16", "f16"} {
		t.Run(dtype, func(t *testing.T) {
			spec := Spec{ModelType: "qwen2", Hidden: 32, Layers: 1, Heads: 4, KVHeads: 2, Intermediate: 48, Vocab: 64,
				MaxPositions: 64, RMSNormEps: 1e-6, RopeTheta: 1e6, BOS: 1, EOS: 2, DType: dtype}
			dir := t.TempDir()
			if err := Write(dir, spec, 1); err != nil {
				t.Fatal(err)
			}
			set, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer set.Close()
			var n int64
			for _, name := range set.Names() {
				ts, _ := set.Tensor(name)
				n += ts.Elements()
			}
			if n != spec.NumParams() {
				t.Errorf("file holds %d parameters, spec says %d", n, spec.NumParams())
			}
			bias, ok := set.Tensor("model.layers.0.self_attn.k_proj.bias")
			if !ok || bias.Shape[0] != 16 {
				t.Fatalf("qwen2 k_proj bias: %+v, %t", bias.Info, ok)
			}
			if _, ok := set.Tensor("lm_head.weight"); !ok {
				t.Error("untied spec wrote no lm_head.weight")
			}
			w, _ := set.Tensor("model.layers.0.mlp.up_proj.weight")
			var sum, sumSq float64
			cnt := w.Elements()
			for i := range cnt {
				v := value(w, int(i))
				sum += v
				sumSq += v * v
			}
			mean, std := sum/float64(cnt), sumSq/float64(cnt)
			if mean > 0.002 || mean < -0.002 || std < 0.0003 || std > 0.0005 {
				t.Errorf("up_proj mean %g, variance %g; want about 0 and 0.02²", mean, std)
			}
			norm, _ := set.Tensor("model.norm.weight")
			if value(norm, 0) != 1 {
				t.Errorf("norm weight = %g, want 1", value(norm, 0))
			}
		})
	}
}

func value(t safetensors.Tensor, i int) float64 {
	switch t.DType {
	case safetensors.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:])))
	case safetensors.BF16:
		return float64(tensor.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
	default:
		return float64(tensor.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:])))
	}
}

func TestF32ToF16RoundsLikeIEEE(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff}, {1e6, 0x7c00},
		{5.960464477539063e-08, 0x0001}, // smallest subnormal
		{6.103515625e-05, 0x0400},       // smallest normal
		{1.0009765625, 0x3c01},
		{1.00048828125, 0x3c00}, // tie rounds to even
		{1e-9, 0},
	}
	for _, tc := range cases {
		got := f32ToF16(tc.in)
		if got != tc.want {
			t.Errorf("f32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
		}
		if back := tensor.F16ToF32(got); tc.want != 0x7c00 && tc.in != 1e-9 && tc.in != 1.00048828125 && back != tc.in {
			t.Errorf("F16ToF32(f32ToF16(%g)) = %g", tc.in, back)
		}
	}
}

func TestShapeAndValidateErrors(t *testing.T) {
	if _, err := Shape("gpt-5", "bf16"); err == nil || !strings.Contains(err.Error(), "smollm2-135m") {
		t.Errorf("unknown shape: %v", err)
	}
	if _, err := Shape(ShapeTiny, "int4"); err == nil || !strings.Contains(err.Error(), "int4") {
		t.Errorf("unknown dtype: %v", err)
	}
	s, _ := Shape(ShapeSmolLM2135M, "bf16")
	if got := s.NumParams(); got != 134515008 {
		t.Errorf("smollm2-135m has %d parameters, want 134515008", got)
	}
	s.KVHeads = 4
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "kv heads") {
		t.Errorf("9 heads / 4 kv heads: %v", err)
	}
}

func TestWriteQwen3MoE(t *testing.T) {
	spec := Spec{ModelType: "qwen3_moe", Hidden: 32, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 12, Intermediate: 48, Vocab: 64,
		MaxPositions: 64, RMSNormEps: 1e-6, RopeTheta: 1e6, BOS: 1, EOS: 2, DType: "f32",
		MoE: MoE{Experts: 4, TopK: 2, Intermediate: 8, NormTopK: true, SparseStep: 1, DenseLayers: []int{1}}}
	dir := t.TempDir()
	if err := Write(dir, spec, 1); err != nil {
		t.Fatal(err)
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	want := map[string][]int{
		"model.layers.0.self_attn.q_norm.weight":         {12},
		"model.layers.0.self_attn.k_norm.weight":         {12},
		"model.layers.0.mlp.gate.weight":                 {4, 32},
		"model.layers.0.mlp.experts.3.gate_proj.weight":  {8, 32},
		"model.layers.2.mlp.experts.0.down_proj.weight":  {32, 8},
		"model.layers.1.mlp.gate_proj.weight":            {48, 32},
		"model.layers.1.mlp.down_proj.weight":            {32, 48},
		"model.layers.2.self_attn.q_proj.weight":         {48, 32},
		"model.layers.2.post_attention_layernorm.weight": {32},
		"model.layers.0.mlp.experts.1.up_proj.weight":    {8, 32},
		"model.layers.2.mlp.experts.2.gate_proj.weight":  {8, 32},
		"model.layers.0.input_layernorm.weight":          {32},
		"model.layers.1.self_attn.k_norm.weight":         {12},
		"model.layers.2.mlp.gate.weight":                 {4, 32},
		"model.layers.1.post_attention_layernorm.weight": {32},
		"model.layers.1.mlp.up_proj.weight":              {48, 32},
		"model.layers.0.post_attention_layernorm.weight": {32},
		"model.layers.0.mlp.experts.0.down_proj.weight":  {32, 8},
	}
	for name, shape := range want {
		ts, ok := set.Tensor(name)
		if !ok || !slices.Equal(ts.Shape, shape) {
			t.Errorf("%s: shape %v (present %t), want %v", name, ts.Shape, ok, shape)
		}
	}
	for _, absent := range []string{"model.layers.1.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.q_proj.bias"} {
		if _, ok := set.Tensor(absent); ok {
			t.Errorf("%s was written", absent)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"Qwen3MoeForCausalLM"`, `"num_experts": 4`, `"num_experts_per_tok": 2`, `"moe_intermediate_size": 8`,
		`"norm_topk_prob": true`, `"decoder_sparse_step": 1`, `"head_dim": 12`} {
		if !strings.Contains(string(cfg), field) {
			t.Errorf("config.json has no %s:\n%s", field, cfg)
		}
	}

	spec.MoE.TopK = 5
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), "top-k") {
		t.Errorf("top-5 of 4 experts: %v", err)
	}
}

func TestQwen3ShapesHaveTheirParameterCounts(t *testing.T) {
	// The published totals: Qwen3-0.6B 0.6B (0.44B without embeddings),
	// Qwen3-30B-A3B 30.5B, Gemma 3 1B 999,885,952 (its safetensors).
	for name, want := range map[string]int64{ShapeQwen306B: 596049920, ShapeQwen330BA3B: 30532122624, ShapeGemma31B: 999885952} {
		s, err := Shape(name, "bf16")
		if err != nil {
			t.Fatal(err)
		}
		if got := s.NumParams(); got != want {
			t.Errorf("%s has %d parameters, want %d", name, got, want)
		}
	}
}
