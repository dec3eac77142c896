package modelinit

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
)

func dtypeOf(name string) (safetensors.DType, error) {
	switch name {
	case "bf16":
		return safetensors.BF16, nil
	case "f16":
		return safetensors.F16, nil
	case "f32":
		return safetensors.F32, nil
	}
	return "", fmt.Errorf("modelinit: dtype %q: expected bf16, f16 or f32", name)
}

func torchDType(name string) string {
	return map[string]string{"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[name]
}

// kind says how a tensor is initialised.
type kind int

const (
	weight kind = iota // uniform, standard deviation Std
	norm               // 1, or 1 ± NormJitter
)

type plannedTensor struct {
	safetensors.Info
	kind kind
}

// plan lists the tensors in file order. q/k/v and gate/up are adjacent so
// that the loader can run each group as one fused matmul.
func (s Spec) plan() []plannedTensor {
	dt, _ := dtypeOf(s.DType)
	hd := s.headDim()
	qd, kvd := s.Heads*hd, s.KVHeads*hd
	var ts []plannedTensor
	add := func(name string, k kind, shape ...int) {
		ts = append(ts, plannedTensor{safetensors.Info{Name: name, DType: dt, Shape: shape}, k})
	}
	add("model.embed_tokens.weight", weight, s.Vocab, s.Hidden)
	qkvBias := s.ModelType == "qwen2" || s.AttentionBias && s.hasAttentionBias()
	for i := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", norm, s.Hidden)
		if s.ModelType == "phi3" {
			add(p+"self_attn.qkv_proj.weight", weight, qd+2*kvd, s.Hidden)
		} else {
			add(p+"self_attn.q_proj.weight", weight, qd, s.Hidden)
			add(p+"self_attn.k_proj.weight", weight, kvd, s.Hidden)
			add(p+"self_attn.v_proj.weight", weight, kvd, s.Hidden)
		}
		if qkvBias {
			add(p+"self_attn.q_proj.bias", weight, qd)
			add(p+"self_attn.k_proj.bias", weight, kvd)
			add(p+"self_attn.v_proj.bias", weight, kvd)
		}
		add(p+"self_attn.o_proj.weight", weight, s.Hidden, qd)
		if s.AttentionBias && s.hasAttentionBias() {
			add(p+"self_attn.o_proj.bias", weight, s.Hidden)
		}
		if s.qkNorm() {
			add(p+"self_attn.q_norm.weight", norm, hd)
			add(p+"self_attn.k_norm.weight", norm, hd)
		}
		add(p+"post_attention_layernorm.weight", norm, s.Hidden)
		if s.ModelType == "gemma3_text" {
			add(p+"pre_feedforward_layernorm.weight", norm, s.Hidden)
			add(p+"post_feedforward_layernorm.weight", norm, s.Hidden)
		}
		if s.sparse(i) && s.ModelType == "mixtral" {
			add(p+"block_sparse_moe.gate.weight", weight, s.MoE.Experts, s.Hidden)
			for x := range s.MoE.Experts {
				q := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, x)
				add(q+"w1.weight", weight, s.Intermediate, s.Hidden)
				add(q+"w3.weight", weight, s.Intermediate, s.Hidden)
				add(q+"w2.weight", weight, s.Hidden, s.Intermediate)
			}
			continue
		}
		if s.sparse(i) {
			e := s.MoE
			add(p+"mlp.gate.weight", weight, e.Experts, s.Hidden)
			for x := range e.Experts {
				q := fmt.Sprintf("%smlp.experts.%d.", p, x)
				add(q+"gate_proj.weight", weight, e.Intermediate, s.Hidden)
				add(q+"up_proj.weight", weight, e.Intermediate, s.Hidden)
				add(q+"down_proj.weight", weight, s.Hidden, e.Intermediate)
			}
			continue
		}
		if s.ModelType == "phi3" {
			add(p+"mlp.gate_up_proj.weight", weight, 2*s.Intermediate, s.Hidden)
		} else {
			add(p+"mlp.gate_proj.weight", weight, s.Intermediate, s.Hidden)
			add(p+"mlp.up_proj.weight", weight, s.Intermediate, s.Hidden)
		}
		add(p+"mlp.down_proj.weight", weight, s.Hidden, s.Intermediate)
	}
	add("model.norm.weight", norm, s.Hidden)
	if !s.Tied {
		add("lm_head.weight", weight, s.Vocab, s.Hidden)
	}
	return ts
}

// hasAttentionBias reports whether the model type reads attention_bias.
func (s Spec) hasAttentionBias() bool {
	switch s.modelType() {
	case "llama", "qwen3", "qwen3_moe", "smollm3":
		return true
	}
	return false
}

// noRopeInterval is the no_rope_layer_interval of a smollm3 model.
func (s Spec) noRopeInterval() int {
	if s.NoRopeInterval == 0 {
		return 4
	}
	return s.NoRopeInterval
}

func (s Spec) modelType() string {
	if s.ModelType == "" {
		return "llama"
	}
	return s.ModelType
}

// NumParams returns the number of parameters the Spec describes.
func (s Spec) NumParams() int64 {
	var n int64
	for _, t := range s.plan() {
		n += t.Elements()
	}
	return n
}

// configJSON returns the config.json object for s.
func (s Spec) configJSON() map[string]any {
	arch := map[string]string{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2": "Qwen2ForCausalLM",
		"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "phi3": "Phi3ForCausalLM"}[s.modelType()]
	c := map[string]any{
		"architectures":           []string{arch},
		"model_type":              s.modelType(),
		"hidden_size":             s.Hidden,
		"num_hidden_layers":       s.Layers,
		"num_attention_heads":     s.Heads,
		"num_key_value_heads":     s.KVHeads,
		"intermediate_size":       s.Intermediate,
		"vocab_size":              s.Vocab,
		"max_position_embeddings": s.MaxPositions,
		"rms_norm_eps":            s.RMSNormEps,
		"rope_theta":              s.RopeTheta,
		"rope_scaling":            nil,
		"hidden_act":              "silu",
		"hidden_activation":       nil,
		"tie_word_embeddings":     s.Tied,
		"bos_token_id":            s.BOS,
		"eos_token_id":            s.EOS,
		"torch_dtype":             torchDType(s.DType),
		"initializer_range":       s.std(),
	}
	if s.HeadDim != 0 {
		c["head_dim"] = s.HeadDim
	}
	var window any // null without a window
	if s.SlidingWindow > 0 {
		window = s.SlidingWindow
	}
	switch s.modelType() {
	case "llama":
		c["attention_bias"] = s.AttentionBias
		c["mlp_bias"] = false
	case "mistral":
		c["sliding_window"] = window
	case "mixtral":
		c["sliding_window"] = window
		c["num_local_experts"] = s.MoE.Experts
		c["num_experts_per_tok"] = s.MoE.TopK
	case "qwen2":
		c["use_sliding_window"] = s.SlidingWindow > 0
		c["sliding_window"] = s.MaxPositions
		if s.SlidingWindow > 0 {
			c["sliding_window"] = s.SlidingWindow
			c["max_window_layers"] = 0
		}
	case "qwen3", "qwen3_moe":
		c["attention_bias"] = s.AttentionBias
		c["use_sliding_window"] = s.SlidingWindow > 0
		c["sliding_window"] = window
		c["max_window_layers"] = s.Layers
		if s.SlidingWindow > 0 {
			c["max_window_layers"] = 0
		}
		c["head_dim"] = s.headDim()
	case "smollm3":
		c["attention_bias"] = s.AttentionBias
		c["mlp_bias"] = false
		c["no_rope_layer_interval"] = s.noRopeInterval()
		c["use_sliding_window"] = s.SlidingWindow > 0
		c["sliding_window"] = window
	case "phi3":
		c["sliding_window"] = window
		if s.PartialRotary > 0 {
			c["partial_rotary_factor"] = s.PartialRotary
		}
	}
	if s.modelType() == "gemma3_text" {
		delete(c, "hidden_act")
		delete(c, "rope_theta")
		delete(c, "rope_scaling")
		c["hidden_activation"] = "gelu_pytorch_tanh"
		c["attention_bias"] = s.AttentionBias
		c["head_dim"] = s.headDim()
		c["sliding_window"] = s.SlidingWindow
		c["query_pre_attn_scalar"] = s.Gemma.QueryScalar
		c["final_logit_softcapping"] = nil
		c["attn_logit_softcapping"] = nil
		types := make([]string, s.Layers)
		for i := range types {
			types[i] = "sliding_attention"
			if (i+1)%s.Gemma.Pattern == 0 {
				types[i] = "full_attention"
			}
		}
		c["layer_types"] = types
		full := map[string]any{"rope_type": "default", "rope_theta": s.RopeTheta}
		if rs := s.RopeScaling; rs.Type != "" {
			full["rope_type"], full["factor"] = rs.Type, rs.Factor
			if rs.Type == "llama3" {
				full["low_freq_factor"] = rs.LowFreqFactor
				full["high_freq_factor"] = rs.HighFreqFactor
				full["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
			}
		}
		c["rope_parameters"] = map[string]any{
			"full_attention":    full,
			"sliding_attention": map[string]any{"rope_type": "default", "rope_theta": s.Gemma.LocalRopeTheta},
		}
	} else {
		delete(c, "hidden_activation")
	}
	if s.modelType() == "qwen3_moe" {
		e := s.MoE
		c["num_experts"] = e.Experts
		c["num_experts_per_tok"] = e.TopK
		c["moe_intermediate_size"] = e.Intermediate
		c["norm_topk_prob"] = e.NormTopK
		c["decoder_sparse_step"] = e.sparseStep()
		dense := e.DenseLayers
		if dense == nil {
			dense = []int{}
		}
		c["mlp_only_layers"] = dense
	}
	if rs := s.RopeScaling; rs.Type != "" && s.modelType() != "gemma3_text" {
		m := map[string]any{"rope_type": rs.Type, "factor": rs.Factor}
		if rs.Type == "llama3" {
			m["low_freq_factor"] = rs.LowFreqFactor
			m["high_freq_factor"] = rs.HighFreqFactor
			m["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
		}
		if rs.Type == "longrope" {
			// Phi-3's layout: factor from the two lengths.
			delete(m, "factor")
			m["short_factor"], m["long_factor"] = rs.ShortFactor, rs.LongFactor
			c["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
		}
		c["rope_scaling"] = m
	}
	return c
}

func (s Spec) std() float64 {
	if s.Std == 0 {
		return 0.02
	}
	return s.Std
}

// Write writes config.json, generation_config.json and model.safetensors
// for s into dir (created if needed). Tensors are generated and streamed
// one chunk at a time, so memory use stays small for billion-parameter
// shapes.
func Write(dir string, s Spec, seed uint64) error { return WriteProgress(dir, s, seed, nil) }

// WriteProgress is Write telling progress (when not nil) the bytes of
// model.safetensors' tensor data written so far and in all: once before the
// first tensor and after every chunk of about 1 MiB.
func WriteProgress(dir string, s Spec, seed uint64, progress func(written, total int64)) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("modelinit: %w", err)
	}
	cfg, err := s.ConfigJSON()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return fmt.Errorf("modelinit: %w", err)
	}
	gen := map[string]any{"bos_token_id": s.BOS, "eos_token_id": s.EOS}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), gen); err != nil {
		return err
	}
	return writeWeights(filepath.Join(dir, safetensors.SingleFile), s, seed, progress)
}

// ConfigJSON returns the config.json that Write writes for s.
func (s Spec) ConfigJSON() ([]byte, error) {
	data, err := json.MarshalIndent(s.configJSON(), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("modelinit: encoding config.json: %w", err)
	}
	return append(data, '\n'), nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("modelinit: encoding %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("modelinit: %w", err)
	}
	return nil
}

func writeWeights(path string, s Spec, seed uint64, progress func(written, total int64)) (err error) {
	plan := s.plan()
	infos := make([]safetensors.Info, len(plan))
	var written, total int64
	for i, t := range plan {
		infos[i] = t.Info
		total += t.Elements() * int64(t.DType.Size())
	}
	if progress != nil {
		progress(0, total)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("modelinit: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("modelinit: %w", cerr)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	w, err := safetensors.NewWriter(bw, infos, map[string]string{"format": "pt", "generator": "tandem modelinit"})
	if err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<20)
	for _, t := range plan {
		g := newGen(seed, t.Name)
		es := t.DType.Size()
		for left := t.Elements(); left > 0; {
			n := min(left, int64(cap(buf)/es))
			buf = buf[:n*int64(es)]
			for i := range int(n) {
				var v float64
				switch t.kind {
				case weight:
					v = g.uniform() * s.std()
				case norm:
					v = g.uniform() * s.NormJitter
					if s.ModelType != "gemma3_text" {
						// Gemma's norms scale by 1 + weight.
						v++
					}
				}
				putValue(buf[i*es:], t.DType, v)
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
			left -= n
			if written += int64(len(buf)); progress != nil {
				progress(written, total)
			}
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("modelinit: writing %s: %w", path, err)
	}
	return nil
}

func putValue(b []byte, dt safetensors.DType, v float64) {
	switch dt {
	case safetensors.F32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case safetensors.BF16:
		binary.LittleEndian.PutUint16(b, tensor.F32ToBF16(float32(v)))
	case safetensors.F16:
		binary.LittleEndian.PutUint16(b, f32ToF16(float32(v)))
	}
}

// f32ToF16 rounds to the nearest IEEE half (ties to even). Weights here are
// small and finite; overflow saturates to infinity and tiny values become
// subnormals or zero.
func f32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	u &= 0x7fffffff
	switch {
	case u >= 0x47800000: // >= 65536 after rounding: infinity (NaN not produced here)
		return sign | 0x7c00
	case u < 0x33000000: // < 2^-25: rounds to zero
		return sign
	case u < 0x38800000: // subnormal half
		exp := int(u >> 23)
		mant := u&0x7fffff | 0x800000
		// value = mant·2^(exp-150) = half·2^-24, so drop 126-exp bits.
		shift := uint(126 - exp)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || rem == mid && half&1 == 1 {
			half++
		}
		return sign | uint16(half)
	}
	h := (u - 0x38000000) >> 13
	rem := u & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++
	}
	if h >= 0x7c00 {
		return sign | 0x7c00
	}
	return sign | uint16(h)
}

// gen is a per-tensor generator: PCG seeded by the model seed and a hash of
// the tensor name, so a tensor's values do not depend on the file order.
type gen struct {
	r *rand.PCG
}

func newGen(seed uint64, name string) gen {
	h := fnv.New64a()
	h.Write([]byte(name))
	return gen{rand.NewPCG(seed, h.Sum64())}
}

// uniform returns a value uniform on [-√3, √3): unit variance, cheaper than
// a normal draw and just as good at keeping activations in range.
func (g gen) uniform() float64 {
	const sqrt3 = 1.7320508075688772
	return (float64(g.r.Uint64()>>11)/(1<<53)*2 - 1) * sqrt3
}
