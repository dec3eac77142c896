package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// The per-architecture GGUF metadata: the general.* and {arch}.* keys
// ConvertToGGUF writes (ggufModelKV), the context length it writes, and the
// checks that a Gemma 3 or SmolLM3 is one a GGUF file of its architecture
// can describe, with the layer patterns llama.cpp assumes for them.

// ggufContextLength is the context_length written for c: its positions,
// or for a model with sliding-window layers the window if smaller. GGUF's
// llama, qwen2 and qwen3 architectures have no window (llama.cpp attends
// to every position), so the file is limited to the positions where full
// and windowed attention agree; gemma3 files keep their window
// (attention.sliding_window).
func ggufContextLength(c *Config) int {
	if c.SlidingWindow > 0 && c.SlidingWindow < c.MaxPositions && c.ModelType != "gemma3_text" {
		return c.SlidingWindow
	}
	return c.MaxPositions
}

// ggufGemmaPattern is the period of llama.cpp's gemma3 layers: every
// pattern-th layer is global, unless attention.sliding_window_pattern says
// otherwise.
const ggufGemmaPattern = 6

// ggufGemmaFits checks that a gemma3_text model is what a gemma3 GGUF file
// can describe: llama.cpp's gemma3 takes the local layers' RoPE base to be
// 10000 and the attention scale to be head_dim^-½ (hidden/heads for the
// 62-layer 27B), as every released Gemma 3 has them, and the global layers
// to be every pattern-th. Anything else is refused rather than written as
// a file llama.cpp would run differently.
func ggufGemmaFits(c *Config) error {
	if c.ModelType != "gemma3_text" {
		return nil
	}
	g := c.Gemma
	if g.LocalRopeTheta != 10000 {
		return fmt.Errorf("model: a Gemma 3 with a local RoPE base of %v cannot be written to GGUF (llama.cpp's gemma3 assumes 10000); serve the safetensors checkpoint instead", g.LocalRopeTheta)
	}
	if g.QueryScalar != ggufGemmaQueryScalar(c) {
		return fmt.Errorf("model: a Gemma 3 with query_pre_attn_scalar %v cannot be written to GGUF (llama.cpp's gemma3 derives %v from its shape); serve the safetensors checkpoint instead", g.QueryScalar, ggufGemmaQueryScalar(c))
	}
	if c.SlidingWindow > 0 {
		if n, ok := ggufGemmaPeriod(c); !ok || (n != ggufGemmaPattern && n <= c.Layers) {
			return fmt.Errorf("model: a Gemma 3 whose global layers %v are not every %dth layer cannot be written to GGUF (llama.cpp's gemma3 assumes that pattern); serve the safetensors checkpoint instead", c.FullLayers, ggufGemmaPattern)
		}
	}
	return nil
}

// ggufSmolLM3NoRope is the period of llama.cpp's smollm3 layers without
// RoPE: every 4th (fixed in llama.cpp; the file has no key for it).
const ggufSmolLM3NoRope = 4

// ggufSmolLM3Fits checks that a smollm3 model's layers without RoPE are
// every ggufSmolLM3NoRope-th, the only pattern a smollm3 GGUF file can
// describe; anything else is refused rather than written as a file
// llama.cpp (and Tandem) would run with RoPE in the wrong layers.
func ggufSmolLM3Fits(c *Config) error {
	if c.ModelType != "smollm3" {
		return nil
	}
	if !slices.Equal(c.NoRopeLayers, ggufSmolLM3NoRopeLayers(c.Layers)) {
		return fmt.Errorf("model: a SmolLM3 whose layers without RoPE are %v (not every %dth) cannot be written to GGUF (llama.cpp's smollm3 assumes that pattern); serve the safetensors checkpoint instead", c.NoRopeLayers, ggufSmolLM3NoRope)
	}
	return nil
}

// ggufSmolLM3NoRopeLayers are the layers without RoPE of a smollm3 GGUF
// file of n layers.
func ggufSmolLM3NoRopeLayers(n int) []int {
	var layers []int
	for i := range n {
		if (i+1)%ggufSmolLM3NoRope == 0 {
			layers = append(layers, i)
		}
	}
	return layers
}

// ggufGemmaQueryScalar is the query_pre_attn_scalar llama.cpp's gemma3
// derives: hidden/heads for the 62-layer 27B, head_dim otherwise.
func ggufGemmaQueryScalar(c *Config) float64 {
	if c.Layers == 62 {
		return float64(c.Hidden / c.Heads)
	}
	return float64(c.HeadDim)
}

// ggufGemmaPeriod returns n when c's global layers are exactly every n-th
// layer (n > Layers: none is).
func ggufGemmaPeriod(c *Config) (int, bool) {
	n := c.Layers + 1
	if len(c.FullLayers) > 0 {
		n = c.FullLayers[0] + 1
	}
	for i := range c.Layers {
		if slices.Contains(c.FullLayers, i) != ((i+1)%n == 0) {
			return 0, false
		}
	}
	return n, true
}

func ggufModelKV(c *Config, arch, name, enc string, plan []ggufEntry) []gguf.KV {
	u32 := func(x int) gguf.Value { return gguf.Uint32Value(uint32(x)) }
	kv := []gguf.KV{
		{Key: "general.architecture", Value: gguf.StringValue(arch)},
		{Key: "general.name", Value: gguf.StringValue(name)},
		{Key: "general.file_type", Value: gguf.Uint32Value(ggufFileTypes[enc])},
	}
	for _, e := range plan {
		if e.typ.Quantized() {
			kv = append(kv, gguf.KV{Key: "general.quantization_version", Value: gguf.Uint32Value(2)})
			break
		}
	}
	kv = append(kv,
		gguf.KV{Key: arch + ".context_length", Value: u32(ggufContextLength(c))},
		gguf.KV{Key: arch + ".rope.dimension_count", Value: u32(c.RotaryDims())},
		gguf.KV{Key: arch + ".embedding_length", Value: u32(c.Hidden)},
		gguf.KV{Key: arch + ".block_count", Value: u32(c.Layers)},
		gguf.KV{Key: arch + ".feed_forward_length", Value: u32(c.Intermediate)},
		gguf.KV{Key: arch + ".attention.head_count", Value: u32(c.Heads)},
		gguf.KV{Key: arch + ".attention.head_count_kv", Value: u32(c.KVHeads)},
		gguf.KV{Key: arch + ".attention.key_length", Value: u32(c.HeadDim)},
		gguf.KV{Key: arch + ".attention.value_length", Value: u32(c.HeadDim)},
		gguf.KV{Key: arch + ".rope.freq_base", Value: gguf.Float32Value(float32(c.RopeTheta))},
		gguf.KV{Key: arch + ".attention.layer_norm_rms_epsilon", Value: gguf.Float32Value(float32(c.RMSNormEps))},
		gguf.KV{Key: arch + ".vocab_size", Value: u32(c.Vocab)},
	)
	if c.MoE.Experts > 0 {
		kv = append(kv,
			gguf.KV{Key: arch + ".expert_count", Value: u32(c.MoE.Experts)},
			gguf.KV{Key: arch + ".expert_used_count", Value: u32(c.MoE.TopK)},
			gguf.KV{Key: arch + ".expert_feed_forward_length", Value: u32(c.MoE.Intermediate)},
			gguf.KV{Key: arch + ".expert_weights_norm", Value: gguf.BoolValue(c.MoE.NormTopK)})
	}
	if c.ModelType == "gemma3_text" {
		if c.SlidingWindow > 0 {
			period, _ := ggufGemmaPeriod(c)
			kv = append(kv,
				gguf.KV{Key: arch + ".attention.sliding_window", Value: u32(c.SlidingWindow)},
				gguf.KV{Key: arch + ".attention.sliding_window_pattern", Value: u32(period)})
		}
		if sc := c.Gemma.FinalLogitSoftcap; sc > 0 {
			kv = append(kv, gguf.KV{Key: arch + ".final_logit_softcapping", Value: gguf.Float32Value(float32(sc))})
		}
	}
	if rs := c.RopeScaling; rs.Type == "longrope" {
		// As llama.cpp's converter writes Phi-3: the length the model
		// was extended to, the original one and the attention factor.
		for i := range kv {
			if kv[i].Key == arch+".context_length" {
				kv[i].Value = u32(int(math.Round(rs.Factor * float64(rs.OriginalMaxPositionEmbeddings))))
			}
		}
		kv = append(kv,
			gguf.KV{Key: arch + ".rope.scaling.attn_factor", Value: gguf.Float32Value(float32(rs.AttentionFactor))},
			gguf.KV{Key: arch + ".rope.scaling.original_context_length", Value: u32(rs.OriginalMaxPositionEmbeddings)})
	}
	if c.RopeScaling.Type == "linear" {
		kv = append(kv,
			gguf.KV{Key: arch + ".rope.scaling.type", Value: gguf.StringValue("linear")},
			gguf.KV{Key: arch + ".rope.scaling.factor", Value: gguf.Float32Value(float32(c.RopeScaling.Factor))})
	}
	return kv
}
