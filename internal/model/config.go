package model

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
)

// Config is a validated model configuration, read from a Hugging Face
// config.json with defaults resolved.
type Config struct {
	// ModelType is "llama", "mistral", "mixtral", "qwen2", "qwen3",
	// "qwen3_moe", "gemma3_text", "smollm3" or "phi3".
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
	// RotaryDim, if positive, is how many leading dimensions of each head
	// RoPE rotates (phi3's partial_rotary_factor); 0: all of them. See
	// RotaryDims.
	RotaryDim int
	// NoRopeLayers lists the layers whose queries and keys get no rotary
	// embedding (SmolLM3's NoPE layers); nil: every layer has RoPE.
	NoRopeLayers []int
	// Gemma is what Gemma 3 adds (gemma3_text); its zero value otherwise.
	Gemma GemmaConfig
	BOS   []int32
	EOS   []int32
	// TorchDType is the torch_dtype the checkpoint declares ("" if absent).
	TorchDType string
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
	fam, ok := families[c.ModelType]
	switch {
	case ok:
	case c.ModelType == "gemma3":
		return nil, fmt.Errorf("model: %s: field \"model_type\": model type \"gemma3\" (Gemma3ForConditionalGeneration, the multimodal Gemma 3 with a vision tower) is not supported; serve a text-only Gemma 3 checkpoint (model_type gemma3_text, Gemma3ForCausalLM, such as gemma-3-1b)", f.file)
	case missingFor[c.ModelType] != "":
		return nil, fmt.Errorf("model: %s: field \"model_type\": model type %q is not supported: %s (supported: %s)", f.file, c.ModelType, missingFor[c.ModelType], supportedModelTypes())
	case c.ModelType == "":
		return nil, fmt.Errorf("model: %s: required field \"model_type\" is missing (supported: %s)", f.file, supportedModelTypes())
	default:
		return nil, fmt.Errorf("model: %s: field \"model_type\": model type %q is not supported (supported: %s)", f.file, c.ModelType, supportedModelTypes())
	}
	if err := f.architectures(c.ModelType, fam.arch); err != nil {
		return nil, err
	}
	if err := f.shape(c, fam); err != nil {
		return nil, err
	}
	if err := fam.rope(f, c); err != nil {
		return nil, err
	}
	if c.TieWordEmbeddings, err = f.boolField("tie_word_embeddings", fam.tied); err != nil {
		return nil, err
	}
	if err := f.activation(fam); err != nil {
		return nil, err
	}
	mlpBias, err := f.boolField("mlp_bias", false)
	if err != nil {
		return nil, err
	}
	if mlpBias {
		return nil, fmt.Errorf("model: %s: field \"mlp_bias\": expected false (MLP biases are not supported), found true", f.file)
	}
	switch fam.bias {
	case qkvBias:
		c.QKVBias = true
	case attentionBias:
		if c.QKVBias, err = f.boolField("attention_bias", false); err != nil {
			return nil, err
		}
		c.OBias = c.QKVBias
	}
	c.QKNorm = fam.qkNorm
	if fam.extra != nil {
		if err := fam.extra(f, c); err != nil {
			return nil, err
		}
	}
	if err := f.slidingWindow(c); err != nil {
		return nil, err
	}
	if err := f.tokensAndDType(c); err != nil {
		return nil, err
	}
	return c, nil
}

// shape reads the sizes every family has: widths, layer and head counts,
// the vocabulary, the positions and the norm epsilon.
func (f *fields) shape(c *Config, fam *family) error {
	var err error
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
		{&c.MaxPositions, "max_position_embeddings", fam.maxPositions, false},
	}
	for _, fld := range ints {
		if *fld.dst, err = f.posInt(fld.name, fld.def, fld.required); err != nil {
			return err
		}
	}
	if c.KVHeads, err = f.posInt("num_key_value_heads", c.Heads, false); err != nil {
		return err
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("model: %s: field \"num_key_value_heads\": expected a divisor of num_attention_heads %d, found %d", f.file, c.Heads, c.KVHeads)
	}
	defHeadDim := fam.headDim
	if defHeadDim == 0 && c.Hidden%c.Heads == 0 {
		defHeadDim = c.Hidden / c.Heads
	}
	if c.HeadDim, err = f.posInt("head_dim", defHeadDim, defHeadDim == 0); err != nil {
		return err
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("model: %s: field \"head_dim\": expected an even size for rotary embeddings, found %d", f.file, c.HeadDim)
	}
	if c.RMSNormEps, err = f.floatField("rms_norm_eps", fam.eps); err != nil {
		return err
	}
	if c.RMSNormEps <= 0 {
		return f.typeErr("rms_norm_eps", "a positive number")
	}
	return nil
}

// activation checks the feed-forward activation is the family's.
func (f *fields) activation(fam *family) error {
	actField, wantAct := "hidden_act", "silu"
	if fam.gelu {
		actField, wantAct = "hidden_activation", "gelu_pytorch_tanh"
		if !f.has(actField) && f.has("hidden_act") {
			actField = "hidden_act"
		}
	}
	act, err := f.stringField(actField, wantAct)
	if err != nil {
		return err
	}
	if act != wantAct {
		return fmt.Errorf("model: %s: field %q: expected %q, found %q", f.file, actField, wantAct, act)
	}
	return nil
}

// tokensAndDType reads the BOS and EOS ids and the declared dtype.
func (f *fields) tokensAndDType(c *Config) error {
	var err error
	if c.BOS, err = f.idsField("bos_token_id"); err != nil {
		return err
	}
	if c.EOS, err = f.idsField("eos_token_id"); err != nil {
		return err
	}
	if c.TorchDType, err = f.stringField("torch_dtype", ""); err != nil {
		return err
	}
	if c.TorchDType == "" {
		// Newer transformers write "dtype".
		if c.TorchDType, err = f.stringField("dtype", ""); err != nil {
			return err
		}
	}
	switch c.TorchDType {
	case "", "float32", "bfloat16", "float16":
	default:
		return fmt.Errorf("model: %s: field \"torch_dtype\": expected float32, bfloat16 or float16, found %q", f.file, c.TorchDType)
	}
	return nil
}

// architectures rejects a config.json whose "architectures" names a model
// other than the causal language model of its model type (a classifier
// head, say, whose output is not next-token logits). An absent list is
// accepted.
func (f *fields) architectures(modelType, want string) error {
	if !f.has("architectures") {
		return nil
	}
	var archs []string
	if err := json.Unmarshal(f.m["architectures"], &archs); err != nil {
		return f.typeErr("architectures", "a list of strings")
	}
	for _, a := range archs {
		if a != want {
			return fmt.Errorf("model: %s: field \"architectures\": architecture %q is not supported for model type %s (supported: %s)", f.file, a, modelType, want)
		}
	}
	return nil
}
