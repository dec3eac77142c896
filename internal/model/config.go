package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// RopeScaling describes how rotary frequencies are rescaled for long
// contexts. Type is "" (none), "linear" or "llama3"; or, for a GGUF file
// with a rope_freqs tensor (how llama.cpp stores Llama 3 scaling), "freqs":
// each frequency is divided by that tensor's factor.
type RopeScaling struct {
	Type   string
	Factor float64
	// llama3 only.
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
}

// Config is a validated model configuration, read from a Hugging Face
// config.json with defaults resolved.
type Config struct {
	// ModelType is "llama", "mistral", "mixtral", "qwen2", "qwen3",
	// "qwen3_moe" or "gemma3_text".
	ModelType         string
	Hidden            int
	Layers            int
	Heads             int
	KVHeads           int
	HeadDim           int
	Intermediate      int
	Vocab             int
	MaxPositions      int
	RMSNormEps        float64
	RopeTheta         float64
	RopeScaling       RopeScaling
	TieWordEmbeddings bool
	// QKVBias is set when q_proj, k_proj and v_proj have biases (qwen2, or
	// llama with attention_bias); OBias when o_proj has one (llama
	// attention_bias).
	QKVBias bool
	OBias   bool
	// QKNorm is set when every query and key head is RMS-normalised (a
	// weight of HeadDim per layer) before RoPE: qwen3 and qwen3_moe.
	QKNorm bool
	// MoE describes the sparse feed-forward layers; its zero value means
	// every layer is dense.
	MoE MoEConfig
	// SlidingWindow is the attention window W of the sliding-window
	// layers (0 = none): a query at position p attends to the keys at
	// positions (p−W, p] only. FullLayers lists the layers that attend to
	// every earlier position all the same (nil: every layer is windowed);
	// see LayerWindow.
	SlidingWindow int
	FullLayers    []int
	// Gemma is what Gemma 3 adds (gemma3_text); its zero value otherwise.
	Gemma GemmaConfig
	BOS   []int32
	EOS   []int32
	// TorchDType is the torch_dtype the checkpoint declares ("" if absent).
	TorchDType string
}

// GemmaConfig is the part of a gemma3_text configuration the Llama family
// lacks. Besides these, a Gemma 3 model normalises with (1 + weight), has
// norms after attention and after the feed-forward block as well as before,
// a GELU-gated (tanh approximation) feed-forward block and embeddings
// scaled by √hidden.
type GemmaConfig struct {
	// LocalRopeTheta is the RoPE base of the sliding-window layers
	// (rope_local_base_freq); the full-attention layers use RopeTheta and
	// RopeScaling.
	LocalRopeTheta float64
	// QueryScalar is query_pre_attn_scalar: the attention scale is
	// QueryScalar^-½ rather than head_dim^-½.
	QueryScalar float64
	// FinalLogitSoftcap, if positive, caps the logits: cap·tanh(l/cap).
	FinalLogitSoftcap float64
}

// MoEConfig is the mixture-of-experts part of a configuration (qwen3_moe,
// mixtral).
// A sparse layer routes each token to TopK of Experts feed-forward
// networks of width Intermediate: softmax over the router logits, the TopK
// largest probabilities kept and, with NormTopK, divided by their sum.
type MoEConfig struct {
	Experts      int
	TopK         int
	NormTopK     bool
	Intermediate int
	// SparseStep makes layer i sparse when (i+1)%SparseStep == 0 and i is
	// not in DenseLayers (mlp_only_layers); the other layers are dense
	// with Config.Intermediate.
	SparseStep  int
	DenseLayers []int
}

// SparseLayer reports whether layer i has a mixture-of-experts
// feed-forward block, following transformers' Qwen3MoeDecoderLayer.
func (c *Config) SparseLayer(i int) bool {
	e := &c.MoE
	return e.Experts > 0 && e.SparseStep > 0 && (i+1)%e.SparseStep == 0 && !slices.Contains(e.DenseLayers, i)
}

// MaxModelLen returns the number of positions a sequence may use: the
// model's max_position_embeddings (a sliding window does not limit it).
func (c *Config) MaxModelLen() int { return c.MaxPositions }

// LayerWindow returns the attention window of layer i: SlidingWindow for a
// sliding-window layer, 0 for a layer with full attention.
func (c *Config) LayerWindow(i int) int {
	if c.SlidingWindow <= 0 || slices.Contains(c.FullLayers, i) {
		return 0
	}
	return c.SlidingWindow
}

// QDim is the width of the concatenated query heads.
func (c *Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is the width of the concatenated key (or value) heads.
func (c *Config) KVDim() int { return c.KVHeads * c.HeadDim }

// GenerationConfig holds the defaults of generation_config.json. A nil
// field was absent from the file.
type GenerationConfig struct {
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
	MaxNewTokens      *int
	DoSample          *bool
	EOS               []int32
}

// fields wraps a decoded JSON object with typed, error-reporting accessors.
type fields struct {
	file string
	m    map[string]json.RawMessage
}

func readFields(path string) (*fields, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return parseFields(filepath.Base(path), data)
}

func parseFields(file string, data []byte) (*fields, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("model: %s: expected a JSON object: %w", file, err)
	}
	return &fields{file: file, m: m}, nil
}

func (f *fields) has(name string) bool {
	v, ok := f.m[name]
	return ok && string(v) != "null"
}

func (f *fields) typeErr(name, want string) error {
	found := strings.TrimSpace(string(f.m[name]))
	if len(found) > 60 {
		found = found[:60] + "..."
	}
	return fmt.Errorf("model: %s: field %q: expected %s, found %s", f.file, name, want, found)
}

// intField reads an integer field; def is used when it is absent and
// required makes absence an error.
func (f *fields) intField(name string, def int, required bool) (int, error) {
	return f.intWant(name, def, required, "an integer")
}

func (f *fields) intWant(name string, def int, required bool, want string) (int, error) {
	if !f.has(name) {
		if required {
			return 0, fmt.Errorf("model: %s: required field %q is missing", f.file, name)
		}
		return def, nil
	}
	var v float64
	if err := json.Unmarshal(f.m[name], &v); err != nil || v != math.Trunc(v) || math.Abs(v) > 1<<53 {
		return 0, f.typeErr(name, want)
	}
	return int(v), nil
}

func (f *fields) posInt(name string, def int, required bool) (int, error) {
	v, err := f.intWant(name, def, required, "a positive integer")
	if err == nil && v <= 0 {
		return 0, f.typeErr(name, "a positive integer")
	}
	return v, err
}

func (f *fields) floatField(name string, def float64) (float64, error) {
	if !f.has(name) {
		return def, nil
	}
	var v float64
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return 0, f.typeErr(name, "a number")
	}
	return v, nil
}

func (f *fields) boolField(name string, def bool) (bool, error) {
	if !f.has(name) {
		return def, nil
	}
	var v bool
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return false, f.typeErr(name, "true or false")
	}
	return v, nil
}

func (f *fields) stringField(name, def string) (string, error) {
	if !f.has(name) {
		return def, nil
	}
	var v string
	if err := json.Unmarshal(f.m[name], &v); err != nil {
		return "", f.typeErr(name, "a string")
	}
	return v, nil
}

// idsField reads a token id given as an integer or a list of integers.
func (f *fields) idsField(name string) ([]int32, error) {
	if !f.has(name) {
		return nil, nil
	}
	var one int64
	if err := json.Unmarshal(f.m[name], &one); err == nil {
		if one < 0 || one > math.MaxInt32 {
			return nil, f.typeErr(name, "a non-negative token id")
		}
		return []int32{int32(one)}, nil
	}
	var many []int64
	if err := json.Unmarshal(f.m[name], &many); err != nil {
		return nil, f.typeErr(name, "a token id or a list of token ids")
	}
	ids := make([]int32, len(many))
	for i, id := range many {
		if id < 0 || id > math.MaxInt32 {
			return nil, f.typeErr(name, "non-negative token ids")
		}
		ids[i] = int32(id)
	}
	return ids, nil
}

// LoadConfig reads and validates dir/config.json, or the metadata of dir
// when it is a GGUF file (see LoadGGUF).
func LoadConfig(dir string) (*Config, error) {
	if gguf.IsFile(dir) {
		c, _, err := LoadGGUFConfig(dir)
		return c, err
	}
	f, err := readFields(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	return f.config()
}

// ParseConfig validates the contents of a config.json.
func ParseConfig(data []byte) (*Config, error) {
	f, err := parseFields("config.json", data)
	if err != nil {
		return nil, err
	}
	return f.config()
}

func (f *fields) config() (*Config, error) {
	c := &Config{}
	var err error
	if c.ModelType, err = f.stringField("model_type", ""); err != nil {
		return nil, err
	}
	switch c.ModelType {
	case "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text":
	case "gemma3":
		return nil, fmt.Errorf("model: %s: field \"model_type\": model type \"gemma3\" (Gemma3ForConditionalGeneration, the multimodal Gemma 3 with a vision tower) is not supported; serve a text-only Gemma 3 checkpoint (model_type gemma3_text, Gemma3ForCausalLM, such as gemma-3-1b)", f.file)
	case "":
		return nil, fmt.Errorf("model: %s: required field \"model_type\" is missing (supported: %s)", f.file, supportedModelTypes)
	default:
		return nil, fmt.Errorf("model: %s: field \"model_type\": model type %q is not supported (supported: %s)", f.file, c.ModelType, supportedModelTypes)
	}
	if err := f.architectures(c.ModelType); err != nil {
		return nil, err
	}
	ints := []struct {
		dst      *int
		name     string
		def      int
		required bool
	}{
		{&c.Hidden, "hidden_size", 0, true},
		{&c.Layers, "num_hidden_layers", 0, true},
		{&c.Heads, "num_attention_heads", 0, true},
		{&c.Intermediate, "intermediate_size", 0, true},
		{&c.Vocab, "vocab_size", 0, true},
		{&c.MaxPositions, "max_position_embeddings", 2048, false},
	}
	if c.ModelType == "gemma3_text" {
		ints[len(ints)-1].def = 131072
	}
	for _, fld := range ints {
		if *fld.dst, err = f.posInt(fld.name, fld.def, fld.required); err != nil {
			return nil, err
		}
	}
	if c.KVHeads, err = f.posInt("num_key_value_heads", c.Heads, false); err != nil {
		return nil, err
	}
	if c.Heads%c.KVHeads != 0 {
		return nil, fmt.Errorf("model: %s: field \"num_key_value_heads\": expected a divisor of num_attention_heads %d, found %d", f.file, c.Heads, c.KVHeads)
	}
	defHeadDim := 0
	if c.Hidden%c.Heads == 0 {
		defHeadDim = c.Hidden / c.Heads
	}
	if c.ModelType == "gemma3_text" {
		defHeadDim = 256 // Gemma3TextConfig's default
	}
	if c.HeadDim, err = f.posInt("head_dim", defHeadDim, defHeadDim == 0); err != nil {
		return nil, err
	}
	if c.HeadDim%2 != 0 {
		return nil, fmt.Errorf("model: %s: field \"head_dim\": expected an even size for rotary embeddings, found %d", f.file, c.HeadDim)
	}
	if c.RMSNormEps, err = f.floatField("rms_norm_eps", 1e-6); err != nil {
		return nil, err
	}
	if c.RMSNormEps <= 0 {
		return nil, f.typeErr("rms_norm_eps", "a positive number")
	}
	if c.ModelType == "gemma3_text" {
		if err := f.gemma(c); err != nil {
			return nil, err
		}
	} else if c.RopeTheta, c.RopeScaling, err = f.rope(); err != nil {
		return nil, err
	}
	if c.TieWordEmbeddings, err = f.boolField("tie_word_embeddings", c.ModelType == "gemma3_text"); err != nil {
		return nil, err
	}
	actField, wantAct := "hidden_act", "silu"
	if c.ModelType == "gemma3_text" {
		actField, wantAct = "hidden_activation", "gelu_pytorch_tanh"
		if !f.has(actField) && f.has("hidden_act") {
			actField = "hidden_act"
		}
	}
	act, err := f.stringField(actField, wantAct)
	if err != nil {
		return nil, err
	}
	if act != wantAct {
		return nil, fmt.Errorf("model: %s: field %q: expected %q, found %q", f.file, actField, wantAct, act)
	}
	mlpBias, err := f.boolField("mlp_bias", false)
	if err != nil {
		return nil, err
	}
	if mlpBias {
		return nil, fmt.Errorf("model: %s: field \"mlp_bias\": expected false (MLP biases are not supported), found true", f.file)
	}
	switch c.ModelType {
	case "qwen2":
		// Qwen2 always has q/k/v biases and no o_proj bias.
		c.QKVBias = true
	case "llama", "qwen3", "qwen3_moe", "gemma3_text":
		if c.QKVBias, err = f.boolField("attention_bias", false); err != nil {
			return nil, err
		}
		c.OBias = c.QKVBias
	}
	if c.ModelType == "qwen3" || c.ModelType == "qwen3_moe" || c.ModelType == "gemma3_text" {
		c.QKNorm = true
	}
	switch c.ModelType {
	case "qwen3_moe":
		if c.MoE, err = f.moe(c); err != nil {
			return nil, err
		}
	case "mixtral":
		if c.MoE, err = f.mixtral(c); err != nil {
			return nil, err
		}
	}
	if err := f.slidingWindow(c); err != nil {
		return nil, err
	}
	if c.BOS, err = f.idsField("bos_token_id"); err != nil {
		return nil, err
	}
	if c.EOS, err = f.idsField("eos_token_id"); err != nil {
		return nil, err
	}
	if c.TorchDType, err = f.stringField("torch_dtype", ""); err != nil {
		return nil, err
	}
	if c.TorchDType == "" {
		// Newer transformers write "dtype".
		if c.TorchDType, err = f.stringField("dtype", ""); err != nil {
			return nil, err
		}
	}
	switch c.TorchDType {
	case "", "float32", "bfloat16", "float16":
	default:
		return nil, fmt.Errorf("model: %s: field \"torch_dtype\": expected float32, bfloat16 or float16, found %q", f.file, c.TorchDType)
	}
	return c, nil
}

// supportedModelTypes lists the model_type values Load accepts, for
// messages.
const supportedModelTypes = "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma3_text"

// architectureOf is the Hugging Face architecture (config.json
// "architectures") each model type is run as: the causal language model
// heads only.
var architectureOf = map[string]string{
	"llama":       "LlamaForCausalLM",
	"mistral":     "MistralForCausalLM",
	"mixtral":     "MixtralForCausalLM",
	"qwen2":       "Qwen2ForCausalLM",
	"qwen3":       "Qwen3ForCausalLM",
	"qwen3_moe":   "Qwen3MoeForCausalLM",
	"gemma3_text": "Gemma3ForCausalLM",
}

// architectures rejects a config.json whose "architectures" names a model
// other than the causal language model of its model type (a classifier
// head, say, whose output is not next-token logits). An absent list is
// accepted.
func (f *fields) architectures(modelType string) error {
	if !f.has("architectures") {
		return nil
	}
	var archs []string
	if err := json.Unmarshal(f.m["architectures"], &archs); err != nil {
		return f.typeErr("architectures", "a list of strings")
	}
	want := architectureOf[modelType]
	for _, a := range archs {
		if a != want {
			return fmt.Errorf("model: %s: field \"architectures\": architecture %q is not supported for model type %s (supported: %s)", f.file, a, modelType, want)
		}
	}
	return nil
}

// moe reads the mixture-of-experts fields of a qwen3_moe config, with the
// defaults of transformers' Qwen3MoeConfig.
func (f *fields) moe(c *Config) (MoEConfig, error) {
	e := MoEConfig{}
	var err error
	ints := []struct {
		dst  *int
		name string
		def  int
	}{
		{&e.Experts, "num_experts", 128},
		{&e.TopK, "num_experts_per_tok", 8},
		{&e.Intermediate, "moe_intermediate_size", 768},
		{&e.SparseStep, "decoder_sparse_step", 1},
	}
	if !f.has("num_experts") && f.has("num_local_experts") {
		// transformers 5 writes num_experts under this name.
		ints[0].name = "num_local_experts"
	}
	for _, fld := range ints {
		if *fld.dst, err = f.posInt(fld.name, fld.def, false); err != nil {
			return e, err
		}
	}
	if e.TopK > e.Experts {
		return e, fmt.Errorf("model: %s: field \"num_experts_per_tok\": expected at most num_experts %d, found %d", f.file, e.Experts, e.TopK)
	}
	if e.NormTopK, err = f.boolField("norm_topk_prob", false); err != nil {
		return e, err
	}
	if f.has("mlp_only_layers") {
		var layers []int
		if err := json.Unmarshal(f.m["mlp_only_layers"], &layers); err != nil {
			return e, f.typeErr("mlp_only_layers", "a list of layer indexes")
		}
		for _, l := range layers {
			if l < 0 || l >= c.Layers {
				return e, fmt.Errorf("model: %s: field \"mlp_only_layers\": layer %d is outside the model's %d layers", f.file, l, c.Layers)
			}
		}
		e.DenseLayers = layers
	}
	return e, nil
}

// mixtral reads the mixture-of-experts fields of a mixtral config, with
// the defaults of transformers' MixtralConfig: every layer is sparse, its
// experts as wide as intermediate_size, and each token's top-k router
// probabilities are divided by their sum (MixtralTopKRouter).
func (f *fields) mixtral(c *Config) (MoEConfig, error) {
	e := MoEConfig{NormTopK: true, SparseStep: 1, Intermediate: c.Intermediate}
	var err error
	if e.Experts, err = f.posInt("num_local_experts", 8, false); err != nil {
		return e, err
	}
	if e.TopK, err = f.posInt("num_experts_per_tok", 2, false); err != nil {
		return e, err
	}
	if e.TopK > e.Experts {
		return e, fmt.Errorf("model: %s: field \"num_experts_per_tok\": expected at most num_local_experts %d, found %d", f.file, e.Experts, e.TopK)
	}
	return e, nil
}

// slidingWindow reads the attention window as transformers applies it:
// mistral and mixtral window every layer when sliding_window is set; qwen2,
// qwen3 and qwen3_moe only with use_sliding_window, qwen3_moe in every
// layer, qwen2 and qwen3 in the layers layer_types marks
// "sliding_attention" or, without layer_types, the layers from
// max_window_layers on (Qwen2Config, Qwen3Config).
func (f *fields) slidingWindow(c *Config) error {
	if c.ModelType == "gemma3_text" {
		return nil // read by gemma
	}
	use := c.ModelType == "mistral" || c.ModelType == "mixtral"
	if strings.HasPrefix(c.ModelType, "qwen") {
		var err error
		if use, err = f.boolField("use_sliding_window", false); err != nil {
			return err
		}
	}
	if !use {
		return nil
	}
	w, err := f.intField("sliding_window", 0, false)
	if err != nil {
		return err
	}
	if w < 0 {
		return f.typeErr("sliding_window", "a positive integer or null")
	}
	c.SlidingWindow = w
	if w == 0 || (c.ModelType != "qwen2" && c.ModelType != "qwen3") {
		return nil
	}
	if f.has("layer_types") {
		full, err := f.fullAttentionLayers(c.Layers)
		c.FullLayers = append(c.FullLayers, full...)
		return err
	}
	first, err := f.intField("max_window_layers", 28, false)
	if err != nil {
		return err
	}
	for i := range min(max(first, 0), c.Layers) {
		c.FullLayers = append(c.FullLayers, i)
	}
	return nil
}

// fullAttentionLayers returns the layers "layer_types" names
// "full_attention" (the others slide).
func (f *fields) fullAttentionLayers(layers int) ([]int, error) {
	types, err := f.layerTypes(layers)
	if err != nil {
		return nil, err
	}
	var full []int
	for i, t := range types {
		if t == "full_attention" {
			full = append(full, i)
		}
	}
	return full, nil
}

// layerTypes reads layer_types: one "full_attention" or
// "sliding_attention" per layer.
func (f *fields) layerTypes(layers int) ([]string, error) {
	var types []string
	if err := json.Unmarshal(f.m["layer_types"], &types); err != nil || len(types) != layers {
		return nil, f.typeErr("layer_types", fmt.Sprintf("a list of %d layer types", layers))
	}
	for _, t := range types {
		if t != "full_attention" && t != "sliding_attention" {
			return nil, fmt.Errorf("model: %s: field \"layer_types\": layer type %q is not supported (supported: full_attention, sliding_attention)", f.file, t)
		}
	}
	return types, nil
}

// gemma reads the fields of a gemma3_text config that the Llama family
// lacks, with the defaults of transformers' Gemma3TextConfig: the two RoPE
// bases (rope_parameters per layer type, as transformers 5 writes it, or
// rope_theta, rope_scaling and rope_local_base_freq), the window and which
// layers use it (layer_types, or every sliding_window_pattern-th layer
// full), query_pre_attn_scalar and the logit soft-capping. What Tandem
// cannot compute (attention-score soft-capping, bidirectional attention)
// is refused.
func (f *fields) gemma(c *Config) error {
	g := &c.Gemma
	var err error
	if f.has("rope_parameters") {
		sub, err := parseFields(f.file, f.m["rope_parameters"])
		if err != nil {
			return f.typeErr("rope_parameters", "an object or null")
		}
		if !sub.has("full_attention") && !sub.has("sliding_attention") {
			return fmt.Errorf("model: %s: field \"rope_parameters\": expected an object per layer type (full_attention, sliding_attention)", f.file)
		}
		if c.RopeTheta, c.RopeScaling, err = sub.ropeOf("full_attention", 1e6); err != nil {
			return err
		}
		var local RopeScaling
		if g.LocalRopeTheta, local, err = sub.ropeOf("sliding_attention", 1e4); err != nil {
			return err
		}
		if local.Type != "" {
			return fmt.Errorf("model: %s: field \"rope_parameters\": rope scaling %q of the sliding-window layers is not supported (supported: default)", f.file, local.Type)
		}
	} else {
		if c.RopeTheta, err = f.floatField("rope_theta", 1e6); err != nil {
			return err
		}
		if c.RopeScaling, err = f.ropeScaling(); err != nil {
			return err
		}
		if g.LocalRopeTheta, err = f.floatField("rope_local_base_freq", 1e4); err != nil {
			return err
		}
	}
	if c.RopeTheta <= 1 || g.LocalRopeTheta <= 1 {
		return fmt.Errorf("model: %s: expected RoPE bases greater than 1, found %v and %v", f.file, c.RopeTheta, g.LocalRopeTheta)
	}
	if g.QueryScalar, err = f.floatField("query_pre_attn_scalar", 256); err != nil {
		return err
	}
	if g.QueryScalar <= 0 {
		return f.typeErr("query_pre_attn_scalar", "a positive number")
	}
	if g.FinalLogitSoftcap, err = f.floatField("final_logit_softcapping", 0); err != nil {
		return err
	}
	if g.FinalLogitSoftcap < 0 {
		return f.typeErr("final_logit_softcapping", "a positive number or null")
	}
	if f.has("attn_logit_softcapping") {
		return fmt.Errorf("model: %s: field \"attn_logit_softcapping\": soft-capping of attention scores is not supported (Gemma 3 has none; expected null)", f.file)
	}
	if bidi, err := f.boolField("use_bidirectional_attention", false); err != nil {
		return err
	} else if bidi {
		return fmt.Errorf("model: %s: field \"use_bidirectional_attention\": bidirectional attention is not supported (expected false)", f.file)
	}
	if c.SlidingWindow, err = f.posInt("sliding_window", 4096, false); err != nil {
		return err
	}
	if f.has("layer_types") {
		full, err := f.fullAttentionLayers(c.Layers)
		c.FullLayers = append(c.FullLayers, full...)
		return err
	}
	pattern, err := f.posInt("sliding_window_pattern", 6, false)
	if err != nil {
		return err
	}
	for i := range c.Layers {
		if (i+1)%pattern == 0 {
			c.FullLayers = append(c.FullLayers, i)
		}
	}
	return nil
}

// ropeOf reads the RoPE base and scaling of one layer type from a
// rope_parameters object keyed by layer type; def is the base when absent.
func (f *fields) ropeOf(layerType string, def float64) (float64, RopeScaling, error) {
	if !f.has(layerType) {
		return def, RopeScaling{}, nil
	}
	sub, err := parseFields(f.file, f.m[layerType])
	if err != nil {
		return 0, RopeScaling{}, f.typeErr(layerType, "an object")
	}
	sub.file = f.file + " rope_parameters." + layerType
	theta, err := sub.floatField("rope_theta", def)
	if err != nil {
		return 0, RopeScaling{}, err
	}
	if !sub.has("rope_type") && !sub.has("type") {
		return theta, RopeScaling{}, nil
	}
	rs, err := sub.scaling()
	return theta, rs, err
}

// rope reads rope_theta and rope_scaling, or the rope_parameters object
// that transformers 5 writes in their place (rope_theta and the scaling
// fields in one object, rope_type "default" for none).
func (f *fields) rope() (float64, RopeScaling, error) {
	src, name := f, "rope_theta"
	if f.has("rope_parameters") {
		sub, err := parseFields(f.file, f.m["rope_parameters"])
		if err != nil {
			return 0, RopeScaling{}, f.typeErr("rope_parameters", "an object or null")
		}
		sub.file = f.file + " rope_parameters"
		if sub.has("rope_theta") || !f.has("rope_theta") {
			src = sub
		}
		theta, err := src.floatField(name, 10000)
		if err != nil {
			return 0, RopeScaling{}, err
		}
		if theta <= 1 {
			return 0, RopeScaling{}, src.typeErr(name, "a number greater than 1")
		}
		if !sub.has("rope_type") && !sub.has("type") {
			return theta, RopeScaling{}, nil
		}
		rs, err := sub.scaling()
		return theta, rs, err
	}
	theta, err := f.floatField(name, 10000)
	if err != nil {
		return 0, RopeScaling{}, err
	}
	if theta <= 1 {
		return 0, RopeScaling{}, f.typeErr(name, "a number greater than 1")
	}
	rs, err := f.ropeScaling()
	return theta, rs, err
}

func (f *fields) ropeScaling() (RopeScaling, error) {
	if !f.has("rope_scaling") {
		return RopeScaling{}, nil
	}
	sub, err := parseFields(f.file, f.m["rope_scaling"])
	if err != nil {
		return RopeScaling{}, f.typeErr("rope_scaling", "an object or null")
	}
	sub.file = f.file + " rope_scaling"
	return sub.scaling()
}

// scaling reads the rope_type (or type) and scaling fields of a
// rope_scaling or rope_parameters object.
func (sub *fields) scaling() (RopeScaling, error) {
	var err error
	var rs RopeScaling
	if rs.Type, err = sub.stringField("rope_type", ""); err != nil {
		return rs, err
	}
	if rs.Type == "" {
		if rs.Type, err = sub.stringField("type", ""); err != nil {
			return rs, err
		}
	}
	switch rs.Type {
	case "default":
		return RopeScaling{}, nil
	case "linear", "llama3":
	case "":
		return rs, fmt.Errorf("model: %s: field \"rope_type\" (or \"type\") is missing", sub.file)
	default:
		return rs, fmt.Errorf("model: %s: field \"rope_type\": rope scaling %q is not supported (supported: default, linear, llama3)", sub.file, rs.Type)
	}
	if rs.Factor, err = sub.floatField("factor", 0); err != nil {
		return rs, err
	}
	if rs.Factor <= 0 {
		return rs, fmt.Errorf("model: %s: field \"factor\": expected a positive number, found %v", sub.file, rs.Factor)
	}
	if rs.Type == "llama3" {
		if rs.LowFreqFactor, err = sub.floatField("low_freq_factor", 0); err != nil {
			return rs, err
		}
		if rs.HighFreqFactor, err = sub.floatField("high_freq_factor", 0); err != nil {
			return rs, err
		}
		if rs.OriginalMaxPositionEmbeddings, err = sub.posInt("original_max_position_embeddings", 0, true); err != nil {
			return rs, err
		}
		if rs.LowFreqFactor <= 0 || rs.HighFreqFactor <= rs.LowFreqFactor {
			return rs, fmt.Errorf("model: %s: expected 0 < low_freq_factor < high_freq_factor, found %v and %v", sub.file, rs.LowFreqFactor, rs.HighFreqFactor)
		}
	}
	return rs, nil
}

// LoadGenerationConfig reads dir/generation_config.json. A missing file
// yields an empty GenerationConfig. For a GGUF file it holds only the
// end-of-generation ids of the tokenizer metadata.
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	if gguf.IsFile(dir) {
		_, g, err := LoadGGUFConfig(dir)
		return g, err
	}
	path := filepath.Join(dir, "generation_config.json")
	if _, err := os.Stat(path); os.IsNotExist(err) {
		return &GenerationConfig{}, nil
	}
	f, err := readFields(path)
	if err != nil {
		return nil, err
	}
	return f.generationConfig()
}

// ParseGenerationConfig validates the contents of a generation_config.json.
func ParseGenerationConfig(data []byte) (*GenerationConfig, error) {
	f, err := parseFields("generation_config.json", data)
	if err != nil {
		return nil, err
	}
	return f.generationConfig()
}

func (f *fields) generationConfig() (*GenerationConfig, error) {
	g := &GenerationConfig{}
	floats := []struct {
		dst  **float64
		name string
		ok   func(float64) bool
		want string
	}{
		{&g.Temperature, "temperature", func(v float64) bool { return v >= 0 }, "a non-negative number"},
		{&g.TopP, "top_p", func(v float64) bool { return v > 0 && v <= 1 }, "a number in (0, 1]"},
		{&g.MinP, "min_p", func(v float64) bool { return v >= 0 && v <= 1 }, "a number in [0, 1]"},
		{&g.RepetitionPenalty, "repetition_penalty", func(v float64) bool { return v > 0 }, "a positive number"},
	}
	for _, fl := range floats {
		if !f.has(fl.name) {
			continue
		}
		v, err := f.floatField(fl.name, 0)
		if err != nil {
			return nil, err
		}
		if !fl.ok(v) {
			return nil, f.typeErr(fl.name, fl.want)
		}
		*fl.dst = &v
	}
	ints := []struct {
		dst  **int
		name string
		min  int
	}{
		{&g.TopK, "top_k", 0},
		{&g.MaxNewTokens, "max_new_tokens", 1},
	}
	for _, fi := range ints {
		if !f.has(fi.name) {
			continue
		}
		v, err := f.intField(fi.name, 0, false)
		if err != nil {
			return nil, err
		}
		if v < fi.min {
			return nil, f.typeErr(fi.name, fmt.Sprintf("an integer >= %d", fi.min))
		}
		*fi.dst = &v
	}
	if f.has("do_sample") {
		v, err := f.boolField("do_sample", false)
		if err != nil {
			return nil, err
		}
		g.DoSample = &v
	}
	var err error
	if g.EOS, err = f.idsField("eos_token_id"); err != nil {
		return nil, err
	}
	return g, nil
}
