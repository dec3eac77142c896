package model

import (
	"fmt"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
)

// The conversion plan: the tensors ConvertToGGUF writes (ggufPlan: the
// checkpoint's, checked against the configuration's shapes, with the
// experts stacked, plus the ones computed here, rope_freqs and phi3's
// longrope factors) and the type each is written in (ggufWeightType, with
// ggufFallback for widths a type's blocks do not divide).

// ggufEntry is one tensor of a conversion plan.
type ggufEntry struct {
	hf, name string
	shape    []int // Hugging Face order
	typ      gguf.Type
	permute  int       // heads to permute the rows of (llama q and k), 0 for none
	data     []float32 // set for tensors computed here (rope_freqs)
	// stack, when set, are the Hugging Face tensors (one per expert)
	// stacked into this one, in order.
	stack []string
}

// ggufPlan lists the tensors to write, checking the checkpoint's shapes.
func ggufPlan(c *Config, set *safetensors.Set, enc string, permute bool) ([]ggufEntry, error) {
	var plan []ggufEntry
	var err error
	check := func(hf string, shape []int) bool {
		if err != nil {
			return false
		}
		t, ok := set.Tensor(hf)
		if !ok {
			err = fmt.Errorf("model: tensor %q is missing (expected shape %s)", hf, shapeString(shape))
			return false
		}
		if !slices.Equal(t.Shape, shape) {
			err = fmt.Errorf("model: tensor %q: expected shape %s, found %s in %s", hf, shapeString(shape), shapeString(t.Shape), t.File)
			return false
		}
		return true
	}
	add := func(hf string, perm int, shape ...int) {
		if check(hf, shape) {
			name, _ := ggufName(hf, c.ModelType)
			plan = append(plan, ggufEntry{hf: hf, name: name, shape: shape, permute: perm})
		}
	}
	// addExperts stacks one matrix of every expert of a layer into one
	// [experts, rows, cols] tensor, as llama.cpp's converter does.
	names := moeNamesOf[c.ModelType]
	addExperts := func(p, part string, rows, cols int) {
		stack := make([]string, c.MoE.Experts)
		for x := range stack {
			stack[x] = p + fmt.Sprintf(names.expert, x) + part
			if !check(stack[x], []int{rows, cols}) {
				return
			}
		}
		name, _, _ := ggufExpert(stack[0])
		plan = append(plan, ggufEntry{hf: stack[0], name: name, shape: []int{c.MoE.Experts, rows, cols}, stack: stack})
	}
	qPerm, kPerm := 0, 0
	if permute {
		qPerm, kPerm = c.Heads, c.KVHeads
	}
	add("model.embed_tokens.weight", 0, c.Vocab, c.Hidden)
	for i := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", 0, c.Hidden)
		if c.ModelType == "phi3" {
			// Fused in the checkpoint and in llama.cpp's phi3 alike.
			add(p+"self_attn.qkv_proj.weight", 0, c.QDim()+2*c.KVDim(), c.Hidden)
			add(p+"self_attn.o_proj.weight", 0, c.Hidden, c.QDim())
			add(p+"post_attention_layernorm.weight", 0, c.Hidden)
			add(p+"mlp.gate_up_proj.weight", 0, 2*c.Intermediate, c.Hidden)
			add(p+"mlp.down_proj.weight", 0, c.Hidden, c.Intermediate)
			continue
		}
		add(p+"self_attn.q_proj.weight", qPerm, c.QDim(), c.Hidden)
		add(p+"self_attn.k_proj.weight", kPerm, c.KVDim(), c.Hidden)
		add(p+"self_attn.v_proj.weight", 0, c.KVDim(), c.Hidden)
		if c.QKVBias {
			add(p+"self_attn.q_proj.bias", qPerm, c.QDim())
			add(p+"self_attn.k_proj.bias", kPerm, c.KVDim())
			add(p+"self_attn.v_proj.bias", 0, c.KVDim())
		}
		add(p+"self_attn.o_proj.weight", 0, c.Hidden, c.QDim())
		if c.OBias {
			add(p+"self_attn.o_proj.bias", 0, c.Hidden)
		}
		if c.QKNorm {
			add(p+"self_attn.q_norm.weight", 0, c.HeadDim)
			add(p+"self_attn.k_norm.weight", 0, c.HeadDim)
		}
		add(p+"post_attention_layernorm.weight", 0, c.Hidden)
		if c.ModelType == "gemma3_text" {
			add(p+"pre_feedforward_layernorm.weight", 0, c.Hidden)
			add(p+"post_feedforward_layernorm.weight", 0, c.Hidden)
		}
		if c.SparseLayer(i) {
			add(p+names.router, 0, c.MoE.Experts, c.Hidden)
			addExperts(p, names.gate, c.MoE.Intermediate, c.Hidden)
			addExperts(p, names.up, c.MoE.Intermediate, c.Hidden)
			addExperts(p, names.down, c.Hidden, c.MoE.Intermediate)
			continue
		}
		add(p+"mlp.gate_proj.weight", 0, c.Intermediate, c.Hidden)
		add(p+"mlp.up_proj.weight", 0, c.Intermediate, c.Hidden)
		add(p+"mlp.down_proj.weight", 0, c.Hidden, c.Intermediate)
	}
	add("model.norm.weight", 0, c.Hidden)
	if !c.TieWordEmbeddings {
		add("lm_head.weight", 0, c.Vocab, c.Hidden)
	}
	if err != nil {
		return nil, err
	}
	if c.RopeScaling.Type == "llama3" {
		plan = append(plan, ggufEntry{name: ggufRopeFreqs, shape: []int{c.HeadDim / 2}, data: llama3RopeFactors(c)})
	}
	if rs := c.RopeScaling; rs.Type == "longrope" {
		plan = append(plan,
			ggufEntry{name: ggufRopeLong, shape: []int{len(rs.LongFactor)}, data: f32s(rs.LongFactor)},
			ggufEntry{name: ggufRopeShort, shape: []int{len(rs.ShortFactor)}, data: f32s(rs.ShortFactor)})
	}
	for i := range plan {
		e := &plan[i]
		layer, part, _ := ggufLayer(e.name)
		// llama.cpp keeps the router (ffn_gate_inp) in F32, like the norms.
		if len(e.shape) == 1 || part == "ffn_gate_inp.weight" {
			e.typ = gguf.F32
			continue
		}
		output := e.name == ggufOutput || e.name == ggufEmbed && c.TieWordEmbeddings
		e.typ = ggufFallback(ggufWeightType(enc, part, layer, c.Layers, output), e.shape[len(e.shape)-1])
	}
	return plan, nil
}

// ggufWeightType is the type of a matrix under an encoding, before the
// fallback for widths the type's blocks do not divide (see GGUFEncodings).
func ggufWeightType(enc, part string, layer, layers int, output bool) gguf.Type {
	switch enc {
	case "f32":
		return gguf.F32
	case "f16":
		return gguf.F16
	case "bf16":
		return gguf.BF16
	case "q8_0":
		return gguf.Q8_0
	case "q6_k":
		return gguf.Q6_K
	case "q4_0", "q5_0":
		if output {
			return gguf.Q6_K
		}
		if enc == "q5_0" {
			return gguf.Q5_0
		}
		return gguf.Q4_0
	}
	base := gguf.Q4_K
	if enc == "q5_k_m" {
		base = gguf.Q5_K
	}
	if output || (part == "attn_v.weight" || part == "ffn_down.weight" || part == "ffn_down_exps.weight") && useMoreBits(layer, layers) {
		return gguf.Q6_K
	}
	return base
}

// useMoreBits is llama.cpp's use_more_bits: the first and last eighth of
// the layers, and every third in between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// ggufFallback replaces a type whose blocks do not divide rows of cols
// weights.
func ggufFallback(t gguf.Type, cols int) gguf.Type {
	if elems, _ := t.BlockSize(); cols%elems == 0 {
		return t
	}
	switch t {
	case gguf.Q4_K:
		return ggufFallback(gguf.Q5_0, cols)
	case gguf.Q5_K, gguf.Q6_K:
		return ggufFallback(gguf.Q8_0, cols)
	}
	return gguf.F16
}

// llama3RopeFactors are the per-frequency divisors of Llama 3 rope scaling,
// as llama.cpp's converter stores them in rope_freqs (computed in float64,
// as ropeInvFreq computes the frequencies themselves).
func llama3RopeFactors(c *Config) []float32 {
	plain := *c
	plain.RopeScaling = RopeScaling{}
	base := ropeInvFreq(&plain)
	scaled := ropeInvFreq(c)
	out := make([]float32, len(base))
	for i := range out {
		out[i] = float32(base[i] / scaled[i])
	}
	return out
}

// f32s narrows xs to float32.
func f32s(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}
