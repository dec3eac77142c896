package model

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/modelinit"
)

const baseConfig = `"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 128, "vocab_size": 100`

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name string
		json string
		want func(*Config)
	}{
		{"llama defaults", `{"model_type": "llama", ` + baseConfig + `}`, func(c *Config) {}},
		{"explicit head_dim and kv heads", `{"model_type": "llama", ` + baseConfig + `, "num_key_value_heads": 2, "head_dim": 16}`, func(c *Config) {
			c.KVHeads, c.HeadDim = 2, 16
		}},
		{"eos as a list, bos as an int", `{"model_type": "llama", ` + baseConfig + `, "bos_token_id": 5, "eos_token_id": [6, 7]}`, func(c *Config) {
			c.BOS, c.EOS = []int32{5}, []int32{6, 7}
		}},
		{"qwen2 gets q/k/v biases", `{"model_type": "qwen2", ` + baseConfig + `, "use_sliding_window": false, "sliding_window": 32768, "torch_dtype": "bfloat16"}`, func(c *Config) {
			c.ModelType, c.QKVBias, c.TorchDType = "qwen2", true, "bfloat16"
		}},
		{"llama attention_bias adds o bias", `{"model_type": "llama", ` + baseConfig + `, "attention_bias": true}`, func(c *Config) {
			c.QKVBias, c.OBias = true, true
		}},
		{"mistral sliding window in every layer", `{"model_type": "mistral", ` + baseConfig + `, "sliding_window": 1024, "max_position_embeddings": 32768}`, func(c *Config) {
			c.ModelType, c.SlidingWindow, c.MaxPositions = "mistral", 1024, 32768
		}},
		{"qwen2 window from max_window_layers on", `{"model_type": "qwen2", ` + baseConfig + `, "num_hidden_layers": 4, "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 2}`, func(c *Config) {
			c.ModelType, c.QKVBias, c.Layers, c.SlidingWindow, c.FullLayers = "qwen2", true, 4, 64, []int{0, 1}
		}},
		{"qwen3 window where layer_types says", `{"model_type": "qwen3", ` + baseConfig + `, "num_hidden_layers": 3, "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 0, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}`, func(c *Config) {
			c.ModelType, c.QKNorm, c.Layers, c.SlidingWindow, c.FullLayers = "qwen3", true, 3, 64, []int{1}
		}},
		{"qwen2 window unused without use_sliding_window", `{"model_type": "qwen2", ` + baseConfig + `, "use_sliding_window": false, "sliding_window": 64, "max_window_layers": 0}`, func(c *Config) {
			c.ModelType, c.QKVBias = "qwen2", true
		}},
		// The configs on the Hub before transformers 5: rope_theta,
		// rope_local_base_freq, sliding_window_pattern.
		{"gemma3 legacy fields", `{"model_type": "gemma3_text", ` + baseConfig + `, "num_hidden_layers": 6, "head_dim": 16, "rope_theta": 1000000, "rope_local_base_freq": 10000, "rope_scaling": {"rope_type": "linear", "factor": 8}, "sliding_window": 512, "sliding_window_pattern": 3, "query_pre_attn_scalar": 16, "final_logit_softcapping": null}`, func(c *Config) {
			c.ModelType, c.Layers, c.HeadDim, c.QKNorm, c.TieWordEmbeddings, c.MaxPositions = "gemma3_text", 6, 16, true, true, 131072
			c.RopeTheta, c.RopeScaling = 1e6, RopeScaling{Type: "linear", Factor: 8}
			c.SlidingWindow, c.FullLayers = 512, []int{2, 5}
			c.Gemma = GemmaConfig{LocalRopeTheta: 1e4, QueryScalar: 16}
		}},
		{"mixtral defaults are transformers'", `{"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], ` + baseConfig + `, "sliding_window": null}`, func(c *Config) {
			c.ModelType = "mixtral"
			c.MoE = MoEConfig{Experts: 8, TopK: 2, NormTopK: true, Intermediate: c.Intermediate, SparseStep: 1}
		}},
		{"rope_scaling with legacy type key", `{"model_type": "llama", ` + baseConfig + `, "rope_scaling": {"type": "linear", "factor": 2.0}}`, func(c *Config) {
			c.RopeScaling = RopeScaling{Type: "linear", Factor: 2}
		}},
		{"llama3 rope scaling", `{"model_type": "llama", ` + baseConfig + `, "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`, func(c *Config) {
			c.RopeTheta = 500000
			c.RopeScaling = RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
		}},
		{"rope_type default means none", `{"model_type": "llama", ` + baseConfig + `, "rope_scaling": {"rope_type": "default"}}`, func(c *Config) {}},
		// transformers 5 writes rope_theta and the scaling in one object.
		{"rope_parameters", `{"model_type": "llama", ` + baseConfig + `, "rope_parameters": {"rope_theta": 500000, "rope_type": "linear", "factor": 4}}`, func(c *Config) {
			c.RopeTheta, c.RopeScaling = 500000, RopeScaling{Type: "linear", Factor: 4}
		}},
		{"rope_parameters default", `{"model_type": "llama", ` + baseConfig + `, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}`, func(c *Config) {
			c.RopeTheta = 1e6
		}},
		{"qwen3 has q/k norms and no biases", `{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], ` + baseConfig + `, "head_dim": 32, "use_sliding_window": false, "sliding_window": null}`, func(c *Config) {
			c.ModelType, c.QKNorm, c.HeadDim = "qwen3", true, 32
		}},
		{"qwen3 attention_bias", `{"model_type": "qwen3", ` + baseConfig + `, "attention_bias": true}`, func(c *Config) {
			c.ModelType, c.QKNorm, c.QKVBias, c.OBias = "qwen3", true, true, true
		}},
		{"qwen3_moe defaults are transformers'", `{"model_type": "qwen3_moe", ` + baseConfig + `}`, func(c *Config) {
			c.ModelType, c.QKNorm = "qwen3_moe", true
			c.MoE = MoEConfig{Experts: 128, TopK: 8, Intermediate: 768, SparseStep: 1}
		}},
		{"qwen3_moe as transformers 5 writes it", `{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], ` + baseConfig + `, "num_local_experts": 8, "num_experts_per_tok": 2,
			"moe_intermediate_size": 16, "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [1]}`, func(c *Config) {
			c.ModelType, c.QKNorm = "qwen3_moe", true
			c.MoE = MoEConfig{Experts: 8, TopK: 2, Intermediate: 16, NormTopK: true, SparseStep: 2, DenseLayers: []int{1}}
		}},
		{"smollm3 defaults are transformers'", `{"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], ` + baseConfig + `, "num_hidden_layers": 8}`, func(c *Config) {
			c.ModelType, c.Layers, c.MaxPositions, c.RopeTheta, c.TieWordEmbeddings = "smollm3", 8, 32768, 2e6, true
			c.NoRopeLayers = []int{3, 7}
		}},
		{"smollm3 no_rope_layers windows its NoPE layers", `{"model_type": "smollm3", ` + baseConfig + `, "num_hidden_layers": 3, "no_rope_layers": [1, 0, 0, 1], "use_sliding_window": true, "sliding_window": 16}`, func(c *Config) {
			c.ModelType, c.Layers, c.MaxPositions, c.RopeTheta, c.TieWordEmbeddings = "smollm3", 3, 32768, 2e6, true
			c.NoRopeLayers, c.SlidingWindow, c.FullLayers = []int{1, 2}, 16, []int{0}
		}},
		{"phi3 defaults are transformers'", `{"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], ` + baseConfig + `, "sliding_window": 2047}`, func(c *Config) {
			c.ModelType, c.MaxPositions, c.RMSNormEps, c.SlidingWindow = "phi3", 4096, 1e-5, 2047
		}},
		// Phi-4-mini's config.json: rope_scaling with the legacy "type",
		// original_max_position_embeddings at the top, a window beyond
		// the positions.
		{"phi4-mini longrope", `{"model_type": "phi3", ` + baseConfig + `, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
			"rope_theta": 10000.0, "rope_scaling": {"type": "longrope", "short_factor": [1, 1.5, 2], "long_factor": [4, 5, 6]}, "sliding_window": 262144, "tie_word_embeddings": true}`, func(c *Config) {
			c.ModelType, c.MaxPositions, c.RMSNormEps, c.RotaryDim, c.TieWordEmbeddings = "phi3", 4096, 1e-5, 6, true
			c.RopeScaling = RopeScaling{Type: "longrope", Factor: 32, OriginalMaxPositionEmbeddings: 4096, ShortFactor: []float64{1, 1.5, 2},
				LongFactor: []float64{4, 5, 6}, AttentionFactor: float64(float32(math.Sqrt(1 + math.Log(32)/math.Log(4096))))}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := &Config{ModelType: "llama", Hidden: 64, Layers: 2, Heads: 8, KVHeads: 8, HeadDim: 8, Intermediate: 128,
				Vocab: 100, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 10000}
			tc.want(want)
			got, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct {
		name, json string
		want       []string
	}{
		{"not an object", `[1]`, []string{"expected a JSON object"}},
		{"missing model_type", `{` + baseConfig + `}`, []string{"model_type", "missing"}},
		{"missing hidden_size", `{"model_type": "llama", "num_hidden_layers": 2}`, []string{"hidden_size", "missing"}},
		{"fractional layers", `{"model_type": "llama", ` + baseConfig + `, "num_hidden_layers": 2.5}`, []string{"num_hidden_layers", "positive integer", "2.5"}},
		{"kv heads not dividing heads", `{"model_type": "llama", ` + baseConfig + `, "num_key_value_heads": 3}`, []string{"num_key_value_heads", "divisor", "found 3"}},
		{"odd head_dim", `{"model_type": "llama", ` + baseConfig + `, "head_dim": 7}`, []string{"head_dim", "even", "7"}},
		{"eos of wrong type", `{"model_type": "llama", ` + baseConfig + `, "eos_token_id": "2"}`, []string{"eos_token_id", "token id", `"2"`}},
		{"bool as string", `{"model_type": "llama", ` + baseConfig + `, "tie_word_embeddings": "yes"}`, []string{"tie_word_embeddings", "true or false"}},
		{"mlp bias", `{"model_type": "llama", ` + baseConfig + `, "mlp_bias": true}`, []string{"mlp_bias"}},
		{"llama3 rope without original length", `{"model_type": "llama", ` + baseConfig + `, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}}`, []string{"original_max_position_embeddings", "missing"}},
		{"rope scaling without factor", `{"model_type": "llama", ` + baseConfig + `, "rope_scaling": {"rope_type": "linear"}}`, []string{"factor", "positive"}},
		{"unknown torch dtype", `{"model_type": "llama", ` + baseConfig + `, "torch_dtype": "int8"}`, []string{"torch_dtype", "int8"}},
		{"architecture of another type", `{"model_type": "qwen3", "architectures": ["Qwen3MoeForCausalLM"], ` + baseConfig + `}`, []string{"architectures", "Qwen3MoeForCausalLM", "not supported", "Qwen3ForCausalLM"}},
		{"qwen3 yarn", `{"model_type": "qwen3", ` + baseConfig + `, "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}}`, []string{"rope_type", "yarn", "not supported"}},
		{"more experts per token than experts", `{"model_type": "qwen3_moe", ` + baseConfig + `, "num_experts": 4, "num_experts_per_tok": 8}`, []string{"num_experts_per_tok", "at most", "4"}},
		{"dense layer out of range", `{"model_type": "qwen3_moe", ` + baseConfig + `, "mlp_only_layers": [2]}`, []string{"mlp_only_layers", "layer 2", "2 layers"}},
		{"mixtral top-k above experts", `{"model_type": "mixtral", ` + baseConfig + `, "num_local_experts": 2, "num_experts_per_tok": 3}`, []string{"num_experts_per_tok", "at most", "2"}},
		{"multimodal gemma3", `{"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {}}`, []string{"gemma3", "Gemma3ForConditionalGeneration", "not supported", "gemma3_text"}},
		{"gemma3 attention soft-capping", `{"model_type": "gemma3_text", ` + baseConfig + `, "attn_logit_softcapping": 50.0}`, []string{"attn_logit_softcapping", "not supported"}},
		{"gemma3 bidirectional", `{"model_type": "gemma3_text", ` + baseConfig + `, "use_bidirectional_attention": true}`, []string{"use_bidirectional_attention", "not supported"}},
		{"gemma3 silu", `{"model_type": "gemma3_text", ` + baseConfig + `, "hidden_activation": "silu"}`, []string{"hidden_activation", "gelu_pytorch_tanh", "silu"}},
		{"gemma3 local rope scaling", `{"model_type": "gemma3_text", ` + baseConfig + `, "rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": 2}}}`, []string{"sliding-window layers", "linear"}},
		{"unknown layer type", `{"model_type": "qwen3", ` + baseConfig + `, "use_sliding_window": true, "sliding_window": 8, "layer_types": ["full_attention", "chunked_attention"]}`, []string{"layer_types", "chunked_attention", "not supported"}},
		{"smollm3 no_rope_layers too short", `{"model_type": "smollm3", ` + baseConfig + `, "no_rope_layers": [1]}`, []string{"no_rope_layers", "at least 2 flags"}},
		{"smollm3 no_rope_layers flag", `{"model_type": "smollm3", ` + baseConfig + `, "no_rope_layers": [1, 2]}`, []string{"no_rope_layers", "layer 1", "flag 2"}},
		{"smollm3 sliding layers without use_sliding_window", `{"model_type": "smollm3", ` + baseConfig + `, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]}`, []string{"layer_types", "use_sliding_window"}},
		{"phi3 linear rope", `{"model_type": "phi3", ` + baseConfig + `, "rope_scaling": {"rope_type": "linear", "factor": 2}}`, []string{"rope_type", "linear", "phi3", "longrope"}},
		{"phi3 longrope without factors", `{"model_type": "phi3", ` + baseConfig + `, "original_max_position_embeddings": 64, "rope_scaling": {"rope_type": "longrope"}}`, []string{"short_factor", "long_factor"}},
		{"phi3 longrope short_factor length", `{"model_type": "phi3", ` + baseConfig + `, "original_max_position_embeddings": 64, "rope_scaling": {"rope_type": "longrope", "short_factor": [1], "long_factor": [1]}}`, []string{"short_factor", "1 and 1 entries", "(4)"}},
		{"phi3 longrope without original length", `{"model_type": "phi3", ` + baseConfig + `, "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [1, 1, 1, 1]}}`, []string{"original_max_position_embeddings", "missing"}},
		{"phi3 odd rotary width", `{"model_type": "phi3", ` + baseConfig + `, "partial_rotary_factor": 0.375}`, []string{"partial_rotary_factor", "3 rotary dimensions"}},
		{"gpt-oss", `{"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], ` + baseConfig + `}`, []string{"gpt_oss", "not supported", "attention sinks", "MXFP4", "supported: llama"}},
		{"layer_types of the wrong length", `{"model_type": "gemma3_text", ` + baseConfig + `, "layer_types": ["full_attention"]}`, []string{"layer_types", "2 layer types"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.json))
			if err == nil {
				t.Fatal("ParseConfig succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseGenerationConfig(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	got, err := ParseGenerationConfig([]byte(`{"temperature": 0.6, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1, "max_new_tokens": 256, "eos_token_id": [128001, 128009], "transformers_version": "4.45"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &GenerationConfig{Temperature: f(0.6), TopP: f(0.9), TopK: i(50), RepetitionPenalty: f(1.1), MaxNewTokens: i(256), EOS: []int32{128001, 128009}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("generation config (-want +got):\n%s", diff)
	}
	empty, err := ParseGenerationConfig([]byte(`{"bos_token_id": 1}`))
	if err != nil || !cmp.Equal(*empty, GenerationConfig{}) {
		t.Errorf("absent fields: got %+v, %v; want all nil", empty, err)
	}
	for _, bad := range []struct{ json, field string }{
		{`{"temperature": "hot"}`, "temperature"},
		{`{"top_p": 1.5}`, "top_p"},
		{`{"top_k": 1.5}`, "top_k"},
		{`{"max_new_tokens": 0}`, "max_new_tokens"},
		{`{"eos_token_id": [-1]}`, "eos_token_id"},
	} {
		if _, err := ParseGenerationConfig([]byte(bad.json)); err == nil || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("ParseGenerationConfig(%s) = %v, want an error naming %s", bad.json, err, bad.field)
		}
	}
}

// TestModelinitShapesParse checks that every shape `tandem model init`
// writes is a config this package accepts, with the architecture intended.
func TestModelinitShapesParse(t *testing.T) {
	want := map[string]Config{
		modelinit.ShapeTiny: {ModelType: "llama", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 128,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, TieWordEmbeddings: true, BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeSmolLM2135M: {ModelType: "llama", Hidden: 576, Layers: 30, Heads: 9, KVHeads: 3, HeadDim: 64, Intermediate: 1536,
			Vocab: 49152, MaxPositions: 8192, RMSNormEps: 1e-5, RopeTheta: 100000, TieWordEmbeddings: true, BOS: []int32{1}, EOS: []int32{2}, TorchDType: "bfloat16"},
		modelinit.ShapeLlama1B: {ModelType: "llama", Hidden: 2048, Layers: 16, Heads: 32, KVHeads: 8, HeadDim: 64, Intermediate: 8192,
			Vocab: 128256, MaxPositions: 131072, RMSNormEps: 1e-5, RopeTheta: 500000, TieWordEmbeddings: true, BOS: []int32{128000}, EOS: []int32{128001}, TorchDType: "bfloat16",
			RopeScaling: RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
		modelinit.ShapeQwen3Tiny: {ModelType: "qwen3", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 128,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000, TieWordEmbeddings: true, QKNorm: true,
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeQwen3MoETiny: {ModelType: "qwen3_moe", Hidden: 64, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 128,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000, QKNorm: true,
			MoE: MoEConfig{Experts: 8, TopK: 2, NormTopK: true, Intermediate: 32, SparseStep: 1, DenseLayers: []int{0}},
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeMixtralTiny: {ModelType: "mixtral", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 96,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-5, RopeTheta: 1000000,
			MoE: MoEConfig{Experts: 4, TopK: 2, NormTopK: true, Intermediate: 96, SparseStep: 1},
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeGemma3Tiny: {ModelType: "gemma3_text", Hidden: 64, Layers: 5, Heads: 4, KVHeads: 2, HeadDim: 24, Intermediate: 128,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000, TieWordEmbeddings: true, QKNorm: true,
			SlidingWindow: 19, FullLayers: []int{2}, Gemma: GemmaConfig{LocalRopeTheta: 10000, QueryScalar: 24},
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeGemma31B: {ModelType: "gemma3_text", Hidden: 1152, Layers: 26, Heads: 4, KVHeads: 1, HeadDim: 256, Intermediate: 6912,
			Vocab: 262144, MaxPositions: 32768, RMSNormEps: 1e-6, RopeTheta: 1000000, TieWordEmbeddings: true, QKNorm: true,
			SlidingWindow: 512, FullLayers: []int{5, 11, 17, 23}, Gemma: GemmaConfig{LocalRopeTheta: 10000, QueryScalar: 256},
			BOS: []int32{2}, EOS: []int32{1}, TorchDType: "bfloat16"},
		modelinit.ShapeQwen306B: {ModelType: "qwen3", Hidden: 1024, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128, Intermediate: 3072,
			Vocab: 151936, MaxPositions: 40960, RMSNormEps: 1e-6, RopeTheta: 1000000, TieWordEmbeddings: true, QKNorm: true,
			BOS: []int32{151643}, EOS: []int32{151645}, TorchDType: "bfloat16"},
		modelinit.ShapeQwen330BA3B: {ModelType: "qwen3_moe", Hidden: 2048, Layers: 48, Heads: 32, KVHeads: 4, HeadDim: 128, Intermediate: 6144,
			Vocab: 151936, MaxPositions: 40960, RMSNormEps: 1e-6, RopeTheta: 1000000, QKNorm: true,
			MoE: MoEConfig{Experts: 128, TopK: 8, NormTopK: true, Intermediate: 768, SparseStep: 1, DenseLayers: []int{}},
			BOS: []int32{151643}, EOS: []int32{151645}, TorchDType: "bfloat16"},
		modelinit.ShapeSmolLM3Tiny: {ModelType: "smollm3", Hidden: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 128,
			Vocab: 1000, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 2000000, NoRopeLayers: []int{1, 3}, SlidingWindow: 13, FullLayers: []int{0, 2},
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapePhi3Tiny: {ModelType: "phi3", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 128,
			Vocab: 1000, MaxPositions: 1024, RMSNormEps: 1e-5, RopeTheta: 10000, TieWordEmbeddings: true, RotaryDim: 12,
			RopeScaling: RopeScaling{Type: "longrope", Factor: 4, OriginalMaxPositionEmbeddings: 1024,
				ShortFactor: []float64{1, float64(float32(1.05)), float64(float32(1.2)), 1.5, 2, 3}, LongFactor: []float64{1, 2, 4, 8, 16, 32},
				AttentionFactor: float64(float32(math.Sqrt(1 + math.Log(4)/math.Log(1024))))},
			BOS: []int32{0}, EOS: []int32{0}, TorchDType: "bfloat16"},
		modelinit.ShapeQwen3MoE7B: {ModelType: "qwen3_moe", Hidden: 2048, Layers: 16, Heads: 16, KVHeads: 16, HeadDim: 128, Intermediate: 1024,
			Vocab: 50304, MaxPositions: 4096, RMSNormEps: 1e-5, RopeTheta: 10000, QKNorm: true,
			MoE: MoEConfig{Experts: 64, TopK: 8, Intermediate: 1024, SparseStep: 1, DenseLayers: []int{}},
			BOS: []int32{50279}, EOS: []int32{50279}, TorchDType: "bfloat16"},
	}
	for _, name := range modelinit.Shapes() {
		t.Run(name, func(t *testing.T) {
			spec, err := modelinit.Shape(name, "bf16")
			if err != nil {
				t.Fatal(err)
			}
			if spec.Vocab == 0 {
				spec.Vocab = 1000 // set from the tokenizer fixture by Init
			}
			data, err := spec.ConfigJSON()
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			w := want[name]
			if diff := cmp.Diff(&w, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
