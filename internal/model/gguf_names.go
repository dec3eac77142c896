package model

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// ggufDTypes map the GGUF tensor types the loader binds to the dtypes with
// the same block layout.
var ggufDTypes = map[gguf.Type]tensor.DType{
	gguf.F32: tensor.F32, gguf.F16: tensor.F16, gguf.BF16: tensor.BF16, gguf.Q8_0: tensor.Q8_0,
	gguf.Q4_0: tensor.Q4_0, gguf.Q5_0: tensor.Q5_0, gguf.Q4_K: tensor.Q4_K, gguf.Q5_K: tensor.Q5_K, gguf.Q6_K: tensor.Q6_K,
}

// ggufDType returns the dtype of a GGUF tensor type.
func ggufDType(t gguf.Type) (tensor.DType, bool) {
	d, ok := ggufDTypes[t]
	return d, ok
}

// The tensor names of llama.cpp's GGUF files for the llama (and Mixtral,
// llama with experts), qwen2, qwen3 and qwen3moe architectures, and the Hugging Face names they correspond
// to.
const (
	ggufEmbed     = "token_embd.weight"
	ggufOutput    = "output.weight"
	ggufNorm      = "output_norm.weight"
	ggufRopeFreqs = "rope_freqs.weight"
	// phi3's longrope factors, one per rotary frequency.
	ggufRopeShort = "rope_factors_short.weight"
	ggufRopeLong  = "rope_factors_long.weight"
)

// ggufPhi3LayerNames are the per-layer names of phi3 files beyond
// ggufLayerNames: the fused projections (ffn_up holds gate then up).
var ggufPhi3LayerNames = map[string]string{
	"self_attn.qkv_proj.weight": "attn_qkv.weight",
	"mlp.gate_up_proj.weight":   "ffn_up.weight",
}

// ggufLayerNames maps the per-layer Hugging Face tensor names (after
// "model.layers.N.") to GGUF's (after "blk.N.").
var ggufLayerNames = map[string]string{
	"input_layernorm.weight":          "attn_norm.weight",
	"post_attention_layernorm.weight": "ffn_norm.weight",
	"self_attn.q_proj.weight":         "attn_q.weight",
	"self_attn.k_proj.weight":         "attn_k.weight",
	"self_attn.v_proj.weight":         "attn_v.weight",
	"self_attn.o_proj.weight":         "attn_output.weight",
	"self_attn.q_proj.bias":           "attn_q.bias",
	"self_attn.k_proj.bias":           "attn_k.bias",
	"self_attn.v_proj.bias":           "attn_v.bias",
	"self_attn.o_proj.bias":           "attn_output.bias",
	"mlp.gate_proj.weight":            "ffn_gate.weight",
	"mlp.up_proj.weight":              "ffn_up.weight",
	"mlp.down_proj.weight":            "ffn_down.weight",
	// qwen3 and qwen3moe.
	"self_attn.q_norm.weight": "attn_q_norm.weight",
	"self_attn.k_norm.weight": "attn_k_norm.weight",
	"mlp.gate.weight":         "ffn_gate_inp.weight",
	// mixtral (GGUF's llama with experts).
	"block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
}

// ggufExpertNames maps the Hugging Face name of one expert's matrix (after
// "model.layers.N.mlp.experts.E." for qwen3_moe, after
// "model.layers.N.block_sparse_moe.experts.E." for mixtral) to the GGUF
// tensor (after "blk.N.") that stacks that matrix of every expert:
// [experts, rows, cols] in Hugging Face order.
var ggufExpertNames = map[string]string{
	"gate_proj.weight": "ffn_gate_exps.weight",
	"up_proj.weight":   "ffn_up_exps.weight",
	"down_proj.weight": "ffn_down_exps.weight",
	"w1.weight":        "ffn_gate_exps.weight",
	"w3.weight":        "ffn_up_exps.weight",
	"w2.weight":        "ffn_down_exps.weight",
}

// ggufExpert returns the stacked GGUF tensor holding the expert matrix hf
// and the expert's index in it.
func ggufExpert(hf string) (string, int, bool) {
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return "", 0, false
	}
	num, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return "", 0, false
	}
	if r, ok := strings.CutPrefix(rest, "mlp.experts."); ok {
		rest = r
	} else if r, ok := strings.CutPrefix(rest, "block_sparse_moe.experts."); ok {
		rest = r
	} else {
		return "", 0, false
	}
	ex, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return "", 0, false
	}
	if _, err := strconv.Atoi(num); err != nil {
		return "", 0, false
	}
	e, err := strconv.Atoi(ex)
	if err != nil || e < 0 {
		return "", 0, false
	}
	g, ok := ggufExpertNames[suffix]
	if !ok {
		return "", 0, false
	}
	return "blk." + num + "." + g, e, true
}

// ggufGemmaLayerNames are the per-layer names of gemma3 files that differ
// from ggufLayerNames: Gemma's norm after attention, before the
// feed-forward block (ffn_norm, as llama's post_attention_layernorm) and
// after it.
var ggufGemmaLayerNames = map[string]string{
	"post_attention_layernorm.weight":   "post_attention_norm.weight",
	"pre_feedforward_layernorm.weight":  "ffn_norm.weight",
	"post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}

// ggufName returns the GGUF name of a Hugging Face tensor name of a model
// of type modelType, and whether it has one.
func ggufName(hf, modelType string) (string, bool) {
	switch hf {
	case "model.embed_tokens.weight":
		return ggufEmbed, true
	case "lm_head.weight":
		return ggufOutput, true
	case "model.norm.weight":
		return ggufNorm, true
	}
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return "", false
	}
	num, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	if _, err := strconv.Atoi(num); err != nil {
		return "", false
	}
	g, ok := ggufLayerNames[suffix]
	if modelType == "gemma3_text" {
		if gg, gok := ggufGemmaLayerNames[suffix]; gok {
			g, ok = gg, true
		}
	}
	if modelType == "phi3" {
		if gg, gok := ggufPhi3LayerNames[suffix]; gok {
			g, ok = gg, true
		}
	}
	if !ok {
		return "", false
	}
	return "blk." + num + "." + g, true
}

// ggufLayer returns the layer number and the per-layer part of a GGUF
// tensor name ("blk.3.attn_q.weight" → 3, "attn_q.weight").
func ggufLayer(name string) (int, string, bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, "", false
	}
	num, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || strconv.Itoa(n) != num {
		return 0, "", false
	}
	return n, suffix, true
}

// permuteRows reorders the rows of a llama q or k projection (heads ×
// headDim rows of rowBytes bytes each) from Hugging Face's rotary layout to
// llama.cpp's, as its converter does (convert_hf_to_gguf.py, LlamaModel
// permute: reshape(heads, 2, headDim/2, ...).swapaxes(1, 2)). Hugging Face
// rotates the pairs (i, i+headDim/2) of each head; llama.cpp's llama
// architecture rotates adjacent pairs (2i, 2i+1), so GGUF row 2i+j of a head
// is Hugging Face row j·headDim/2+i. With inverse it undoes that.
func permuteRows(data []byte, heads, headDim, rowBytes int, inverse bool) error {
	if headDim%2 != 0 || heads*headDim*rowBytes != len(data) {
		return fmt.Errorf("model: cannot permute %d bytes as %d heads of %d rows of %d bytes", len(data), heads, headDim, rowBytes)
	}
	half := headDim / 2
	tmp := make([]byte, headDim*rowBytes)
	for h := range heads {
		head := data[h*headDim*rowBytes : (h+1)*headDim*rowBytes]
		copy(tmp, head)
		for i := range half {
			for j := range 2 {
				hf, gg := j*half+i, 2*i+j
				src, dst := hf, gg
				if inverse {
					src, dst = gg, hf
				}
				copy(head[dst*rowBytes:(dst+1)*rowBytes], tmp[src*rowBytes:(src+1)*rowBytes])
			}
		}
	}
	return nil
}
