package model

import "strings"

// family is how the config.json of one model type is read: the defaults of
// its transformers configuration class and the fields only it has.
type family struct {
	// arch is the Hugging Face architecture (config.json "architectures")
	// the model type is run as: the causal language model head only.
	arch string
	// maxPositions, headDim and eps are the defaults of
	// max_position_embeddings, head_dim (0: hidden_size/num_attention_heads)
	// and rms_norm_eps.
	maxPositions int
	headDim      int
	eps          float64
	// tied is the default of tie_word_embeddings.
	tied bool
	// gelu makes the feed-forward activation GELU (tanh approximation,
	// field hidden_activation) rather than SiLU (hidden_act).
	gelu bool
	// bias says where the attention projections' biases come from.
	bias biasRule
	// qkNorm: every query and key head is RMS-normalised before RoPE.
	qkNorm bool
	// rope reads the RoPE base and scaling (and, for Gemma 3, everything
	// else it adds).
	rope func(f *fields, c *Config) error
	// extra, if set, reads the family's remaining fields (its experts, its
	// RoPE-less layers); it runs before slidingWindow.
	extra func(f *fields, c *Config) error
}

// biasRule is where a family's attention biases come from.
type biasRule int

const (
	// noBias: the family has no attention biases.
	noBias biasRule = iota
	// qkvBias: q, k and v always have biases, o never (qwen2).
	qkvBias
	// attentionBias: all four have biases when attention_bias is true.
	attentionBias
)

// familyOrder lists the model types Load accepts, in the order messages
// name them.
var familyOrder = []string{"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "smollm3", "phi3"}

// families maps each model_type to how its config.json is read.
var families = map[string]*family{
	"llama":       &llamaFamily,
	"mistral":     &mistralFamily,
	"mixtral":     &mixtralFamily,
	"qwen2":       &qwen2Family,
	"qwen3":       &qwen3Family,
	"qwen3_moe":   &qwen3MoEFamily,
	"gemma3_text": &gemma3Family,
	"smollm3":     &smolLM3Family,
	"phi3":        &phi3Family,
}

// missingFor names, for model types Tandem knows of but cannot run, what it
// lacks (config.json's model_type and GGUF's general.architecture).
var missingFor = map[string]string{
	"gpt_oss": "gpt-oss (GptOssForCausalLM) needs attention sinks (a learned per-head logit in every softmax), " +
		"alternating sliding-window and full-attention layers with its YaRN RoPE, and mixture-of-experts layers " +
		"with MXFP4-quantized experts, biases and a clamped SwiGLU, which Tandem does not implement",
	"gpt-oss": "gpt-oss needs attention sinks, alternating sliding-window layers with YaRN RoPE and MXFP4-quantized " +
		"experts with biases, which Tandem does not implement",
}

// supportedModelTypes lists the model_type values Load accepts, for
// messages.
func supportedModelTypes() string { return strings.Join(familyOrder, ", ") }

// readRope is the rope reader of the families with one RoPE for every
// layer and a default base of 10000.
func readRope(f *fields, c *Config) error {
	var err error
	c.RopeTheta, c.RopeScaling, err = f.rope(10000)
	return err
}
