package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// Bounds on GGUF hyperparameters, far above any real model's, so that a
// hostile file cannot make the loader allocate per-layer or per-position
// state it does not have the tensors for.
const (
	maxGGUFDim       = 1 << 20
	maxGGUFPositions = 1 << 26
)

// LoadGGUFConfig reads the model configuration and generation defaults
// from the metadata of the GGUF file at path (see LoadGGUF).
func LoadGGUFConfig(path string) (*Config, *GenerationConfig, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("model: %w", err)
	}
	defer f.Close()
	return ggufConfig(f)
}

// ggufConfig maps the {arch}.* hyperparameters, the tokenizer's special
// ids and the tensors present to a Config.
func ggufConfig(f *gguf.File) (*Config, *GenerationConfig, error) {
	where := f.Path
	if where == "" {
		where = "GGUF file"
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("model: %s: %s", where, fmt.Sprintf(format, args...))
	}
	arch, ok, err := f.Str("general.architecture")
	if err != nil {
		return nil, nil, fmt.Errorf("model: %s: %w", where, err)
	}
	if !ok {
		return nil, nil, fail("general.architecture is missing")
	}
	c := &Config{ModelType: arch}
	if err := ggufModelType(f, c, arch, fail); err != nil {
		return nil, nil, err
	}
	uintKey := func(dst *int, suffix string, def int, limit int) error {
		key := arch + "." + suffix
		v, ok, err := f.Uint(key)
		if err != nil {
			return fmt.Errorf("model: %s: %w", where, err)
		}
		if !ok {
			if def == 0 {
				return fail("required key %s is missing", key)
			}
			*dst = def
			return nil
		}
		if v == 0 || v > uint64(limit) {
			return fail("%s = %d: expected 1 to %d", key, v, limit)
		}
		*dst = int(v)
		return nil
	}
	for _, k := range []struct {
		dst    *int
		suffix string
		limit  int
	}{
		{&c.MaxPositions, "context_length", maxGGUFPositions},
		{&c.Hidden, "embedding_length", maxGGUFDim},
		{&c.Layers, "block_count", maxGGUFDim},
		{&c.Intermediate, "feed_forward_length", maxGGUFDim},
		{&c.Heads, "attention.head_count", maxGGUFDim},
	} {
		if err := uintKey(k.dst, k.suffix, 0, k.limit); err != nil {
			return nil, nil, err
		}
	}
	if err := uintKey(&c.KVHeads, "attention.head_count_kv", c.Heads, maxGGUFDim); err != nil {
		return nil, nil, err
	}
	if c.Heads%c.KVHeads != 0 {
		return nil, nil, fail("%s.attention.head_count_kv %d does not divide head_count %d", arch, c.KVHeads, c.Heads)
	}
	defHead := 0
	if c.Hidden%c.Heads == 0 {
		defHead = c.Hidden / c.Heads
	}
	var keyLen, valueLen int
	if err := uintKey(&keyLen, "attention.key_length", defHead, maxGGUFDim); err != nil {
		return nil, nil, err
	}
	if err := uintKey(&valueLen, "attention.value_length", keyLen, maxGGUFDim); err != nil {
		return nil, nil, err
	}
	var rot int
	if err := uintKey(&rot, "rope.dimension_count", keyLen, maxGGUFDim); err != nil {
		return nil, nil, err
	}
	c.HeadDim = keyLen
	if arch == "phi3" && rot < keyLen && rot%2 == 0 {
		// Phi-3's partial rotary embeddings.
		c.RotaryDim = rot
	} else if keyLen != valueLen || rot != keyLen || c.HeadDim%2 != 0 {
		return nil, nil, fail("head sizes key %d, value %d, rotary %d: expected one even size (partial rotary embeddings are supported for phi3 only)", keyLen, valueLen, rot)
	}
	if c.Layers > len(f.Tensors) {
		return nil, nil, fail("%s.block_count %d is more than the file's %d tensors allow", arch, c.Layers, len(f.Tensors))
	}
	eps, ok, err := f.Float(arch + ".attention.layer_norm_rms_epsilon")
	if err != nil {
		return nil, nil, fmt.Errorf("model: %s: %w", where, err)
	}
	if !ok || !(eps > 0) {
		return nil, nil, fail("%s.attention.layer_norm_rms_epsilon: expected a positive float, found %v (present %t)", arch, eps, ok)
	}
	c.RMSNormEps = eps
	if arch == "qwen3moe" || c.ModelType == "mixtral" {
		if err := ggufMoE(f, c, arch, uintKey, fail); err != nil {
			return nil, nil, err
		}
	}
	if arch == "gemma3" {
		if err := ggufGemma(f, c, arch, fail); err != nil {
			return nil, nil, err
		}
	}
	if arch == "smollm3" {
		// llama.cpp's smollm3: every 4th layer without RoPE, no window.
		c.NoRopeLayers = ggufSmolLM3NoRopeLayers(c.Layers)
	}
	c.RopeTheta = 10000
	if theta, ok, err := f.Float(arch + ".rope.freq_base"); err != nil {
		return nil, nil, fmt.Errorf("model: %s: %w", where, err)
	} else if ok {
		if !(theta > 1) || math.IsInf(theta, 0) {
			return nil, nil, fail("%s.rope.freq_base %v: expected a number greater than 1", arch, theta)
		}
		c.RopeTheta = theta
	}
	if c.RopeScaling, err = ggufRopeScaling(f, arch, fail); err != nil {
		return nil, nil, err
	}
	if _, ok := f.Tensor(ggufRopeFreqs); ok {
		if c.RopeScaling.Type != "" {
			return nil, nil, fail("has both %s scaling and a %s tensor", c.RopeScaling.Type, ggufRopeFreqs)
		}
		c.RopeScaling = RopeScaling{Type: "freqs"}
	}
	if arch == "phi3" {
		if err := ggufPhi3(f, c, arch, fail); err != nil {
			return nil, nil, err
		}
	}

	if err := ggufTensorFacts(f, c, fail); err != nil {
		return nil, nil, err
	}
	gen, err := ggufSpecialIDs(f, c, fail)
	if err != nil {
		return nil, nil, err
	}
	return c, gen, nil
}

// ggufModelType sets c's model type (and QK norm) from the GGUF
// architecture, or refuses the architectures Tandem does not serve.
func ggufModelType(f *gguf.File, c *Config, arch string, fail func(string, ...any) error) error {
	switch arch {
	case "llama":
		if n, ok, _ := f.Uint(arch + ".expert_count"); ok && n > 0 {
			// llama.cpp writes Mixtral as llama with stacked experts.
			c.ModelType = "mixtral"
		}
	case "qwen2":
		if n, ok, _ := f.Uint(arch + ".expert_count"); ok && n > 0 {
			return fail("a %s file with %d experts (Qwen2-MoE) is not supported; serve a Hugging Face checkpoint of a supported model type instead", arch, n)
		}
	case "qwen3":
		c.QKNorm = true
	case "qwen3moe":
		c.ModelType, c.QKNorm = "qwen3_moe", true
	case "gemma3":
		c.ModelType, c.QKNorm = "gemma3_text", true
	case "smollm3":
	case "phi3":
	case "gpt-oss":
		return fail("architecture %q is not supported: %s", arch, missingFor[arch])
	default:
		return fail("architecture %q is not supported (supported: llama, which GGUF also uses for Mistral and Mixtral, qwen2, qwen3, qwen3moe, gemma3, smollm3 and phi3)", arch)
	}
	return nil
}

// ggufTensorFacts reads what the tensors present say: the vocabulary size
// (the embedding's rows, which the tokenizer's token list must match), tied
// embeddings (no output tensor) and the attention biases.
func ggufTensorFacts(f *gguf.File, c *Config, fail func(string, ...any) error) error {
	embd, ok := f.Tensor(ggufEmbed)
	if !ok {
		return fail("tensor %s is missing", ggufEmbed)
	}
	if len(embd.Dims) != 2 || embd.Dims[1] > math.MaxInt32 {
		return fail("tensor %s has dimensions %v, expected [hidden, vocab]", ggufEmbed, embd.Dims)
	}
	c.Vocab = int(embd.Dims[1])
	if v, ok := f.Get("tokenizer.ggml.tokens"); ok {
		if n := v.Len(); n != c.Vocab {
			return fail("tokenizer.ggml.tokens has %d tokens but %s has %d rows", n, ggufEmbed, c.Vocab)
		}
	}
	_, hasOutput := f.Tensor(ggufOutput)
	c.TieWordEmbeddings = !hasOutput
	_, c.QKVBias = f.Tensor("blk.0.attn_q.bias")
	_, c.OBias = f.Tensor("blk.0.attn_output.bias")
	return nil
}

// ggufSpecialIDs reads the tokenizer's BOS into c and its end-of-generation
// ids (eos, eot, eom) into the generation defaults, the first also into c.
func ggufSpecialIDs(f *gguf.File, c *Config, fail func(string, ...any) error) (*GenerationConfig, error) {
	gen := &GenerationConfig{}
	ids := func(key string) (int32, bool, error) {
		v, ok, err := f.Uint(key)
		if err != nil || !ok {
			return 0, false, err
		}
		if v >= uint64(c.Vocab) {
			return 0, false, fail("%s = %d is outside the vocabulary of %d", key, v, c.Vocab)
		}
		return int32(v), true, nil
	}
	if id, ok, err := ids("tokenizer.ggml.bos_token_id"); err != nil {
		return nil, err
	} else if ok {
		c.BOS = []int32{id}
	}
	for _, key := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		id, ok, err := ids(key)
		if err != nil {
			return nil, err
		}
		if ok && !containsID(gen.EOS, id) {
			gen.EOS = append(gen.EOS, id)
		}
	}
	if len(gen.EOS) > 0 {
		c.EOS = []int32{gen.EOS[0]}
	}
	return gen, nil
}

// ggufMoE reads the mixture-of-experts keys of a qwen3moe or Mixtral
// (llama with experts) file. The experts are expert_feed_forward_length
// wide, or for Mixtral (whose llama.cpp files lack the key)
// feed_forward_length. The top-k weights are normalised unless
// {arch}.expert_weights_norm says false (llama.cpp always normalises them
// for qwen3moe, as every released Qwen3-MoE does, and for Mixtral); a
// layer is sparse when it has a router (ffn_gate_inp), dense otherwise.
func ggufMoE(f *gguf.File, c *Config, arch string, uintKey func(*int, string, int, int) error, fail func(string, ...any) error) error {
	e := &c.MoE
	for _, k := range []struct {
		dst    *int
		suffix string
		def    int
	}{{&e.Experts, "expert_count", 0}, {&e.TopK, "expert_used_count", 0}, {&e.Intermediate, "expert_feed_forward_length", 0}} {
		if k.suffix == "expert_feed_forward_length" && c.ModelType == "mixtral" {
			k.def = c.Intermediate
		}
		if err := uintKey(k.dst, k.suffix, k.def, maxGGUFDim); err != nil {
			return err
		}
	}
	if e.TopK > e.Experts {
		return fail("%s.expert_used_count %d is more than expert_count %d", arch, e.TopK, e.Experts)
	}
	norm, ok, err := f.Bool(arch + ".expert_weights_norm")
	if err != nil {
		return fail("%v", err)
	}
	e.NormTopK = norm || !ok
	e.SparseStep = 1
	for i := range c.Layers {
		if _, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", i)); !ok {
			e.DenseLayers = append(e.DenseLayers, i)
		}
	}
	return nil
}

// ggufGemma reads what a gemma3 file says, and what llama.cpp's gemma3
// assumes, beyond the common keys: the window (attention.sliding_window;
// none: every layer global), every attention.sliding_window_pattern-th
// layer (6) global, the local layers' RoPE base (rope.freq_base_swa, else
// 10000), the attention scale (head_dim^-½, or (hidden/heads)^-½ for the
// 62-layer 27B) and final_logit_softcapping.
func ggufGemma(f *gguf.File, c *Config, arch string, fail func(string, ...any) error) error {
	g := &c.Gemma
	g.LocalRopeTheta = 10000
	if v, ok, err := f.Float(arch + ".rope.freq_base_swa"); err != nil {
		return fail("%v", err)
	} else if ok {
		if !(v > 1) || math.IsInf(v, 0) {
			return fail("%s.rope.freq_base_swa %v: expected a number greater than 1", arch, v)
		}
		g.LocalRopeTheta = v
	}
	g.QueryScalar = ggufGemmaQueryScalar(c)
	if v, ok, err := f.Float(arch + ".final_logit_softcapping"); err != nil {
		return fail("%v", err)
	} else if ok && v != 0 {
		if !(v > 0) || math.IsInf(v, 0) {
			return fail("%s.final_logit_softcapping %v: expected a positive number", arch, v)
		}
		g.FinalLogitSoftcap = v
	}
	if _, ok, err := f.Float(arch + ".attn_logit_softcapping"); err != nil {
		return fail("%v", err)
	} else if ok {
		return fail("%s.attn_logit_softcapping: soft-capping of attention scores is not supported", arch)
	}
	w, ok, err := f.Uint(arch + ".attention.sliding_window")
	if err != nil {
		return fail("%v", err)
	}
	if !ok || w == 0 {
		return nil
	}
	if w > maxGGUFPositions {
		return fail("%s.attention.sliding_window %d: expected at most %d", arch, w, maxGGUFPositions)
	}
	c.SlidingWindow = int(w)
	period := uint64(ggufGemmaPattern)
	if v, ok, err := f.Uint(arch + ".attention.sliding_window_pattern"); err != nil {
		return fail("%s.attention.sliding_window_pattern: expected one period (per-layer patterns are not supported): %v", arch, err)
	} else if ok {
		if v == 0 {
			return fail("%s.attention.sliding_window_pattern: expected a positive period", arch)
		}
		period = v
	}
	for i := range c.Layers {
		if uint64(i+1)%period == 0 {
			c.FullLayers = append(c.FullLayers, i)
		}
	}
	return nil
}

// ggufPhi3 reads what a phi3 file adds: longrope as the
// rope_factors_short and rope_factors_long tensors with
// rope.scaling.attn_factor and rope.scaling.original_context_length (the
// short factors are used, and the positions limited to the original
// length, as for a config.json: see fields.longrope), and the window of
// every layer (attention.sliding_window, if shorter than the positions).
func ggufPhi3(f *gguf.File, c *Config, arch string, fail func(string, ...any) error) error {
	if w, ok, err := f.Uint(arch + ".attention.sliding_window"); err != nil {
		return fail("%v", err)
	} else if ok && w > 0 && w < uint64(c.MaxPositions) {
		c.SlidingWindow = int(w)
	}
	short, hasShort := f.Tensor(ggufRopeShort)
	long, hasLong := f.Tensor(ggufRopeLong)
	if !hasShort && !hasLong {
		return nil
	}
	half := c.RotaryDims() / 2
	read := func(t *gguf.TensorInfo) ([]float64, error) {
		if t.Type != gguf.F32 || len(t.Dims) != 1 || t.Dims[0] != int64(half) {
			return nil, fail("tensor %s: expected %d F32 factors, found %s %v", t.Name, half, t.Type, t.Dims)
		}
		b := make([]byte, t.Size)
		if err := f.ReadTensor(t, b); err != nil {
			return nil, fail("%v", err)
		}
		out := make([]float64, half)
		for i := range out {
			out[i] = float64(f32At(b, i))
		}
		return out, nil
	}
	if !hasShort || !hasLong {
		return fail("longrope needs both %s and %s", ggufRopeShort, ggufRopeLong)
	}
	if c.RopeScaling.Type != "" {
		return fail("has both %s scaling and longrope factors", c.RopeScaling.Type)
	}
	rs := RopeScaling{Type: "longrope", AttentionFactor: 1}
	var err error
	if rs.ShortFactor, err = read(short); err != nil {
		return err
	}
	if rs.LongFactor, err = read(long); err != nil {
		return err
	}
	if v, ok, err := f.Float(arch + ".rope.scaling.attn_factor"); err != nil {
		return fail("%v", err)
	} else if ok {
		if !(v > 0) || math.IsInf(v, 0) {
			return fail("%s.rope.scaling.attn_factor %v: expected a positive number", arch, v)
		}
		rs.AttentionFactor = v
	}
	orig, ok, err := f.Uint(arch + ".rope.scaling.original_context_length")
	if err != nil {
		return fail("%v", err)
	}
	if !ok || orig == 0 || orig > maxGGUFPositions {
		return fail("longrope needs %s.rope.scaling.original_context_length", arch)
	}
	rs.OriginalMaxPositionEmbeddings = int(orig)
	rs.Factor = float64(c.MaxPositions) / float64(orig)
	c.RopeScaling = rs
	c.MaxPositions = min(c.MaxPositions, int(orig))
	return c.checkLongrope(f.Path)
}

func containsID(ids []int32, id int32) bool {
	return slices.Contains(ids, id)
}

func ggufRopeScaling(f *gguf.File, arch string, fail func(string, ...any) error) (RopeScaling, error) {
	typ, _, err := f.Str(arch + ".rope.scaling.type")
	if err != nil {
		return RopeScaling{}, fail("%v", err)
	}
	factor, hasFactor, err := f.Float(arch + ".rope.scaling.factor")
	if err != nil {
		return RopeScaling{}, fail("%v", err)
	}
	if typ == "" {
		// Older files: rope.scale_linear.
		if lin, ok, err := f.Float(arch + ".rope.scale_linear"); err != nil {
			return RopeScaling{}, fail("%v", err)
		} else if ok && lin != 1 {
			typ, factor, hasFactor = "linear", lin, true
		}
	}
	switch typ {
	case "", "none":
		return RopeScaling{}, nil
	case "linear":
		if !hasFactor || !(factor > 0) || math.IsInf(factor, 0) {
			return RopeScaling{}, fail("linear rope scaling needs a positive %s.rope.scaling.factor, found %v", arch, factor)
		}
		if factor == 1 {
			return RopeScaling{}, nil
		}
		return RopeScaling{Type: "linear", Factor: factor}, nil
	}
	return RopeScaling{}, fail("%s.rope.scaling.type %q is not supported (supported: none, linear; Llama 3 scaling comes as a %s tensor)", arch, typ, ggufRopeFreqs)
}
