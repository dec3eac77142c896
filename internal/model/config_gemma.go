package model

import (
	"fmt"
)

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

// gemma3Family is gemma3_text, with the defaults of transformers'
// Gemma3TextConfig; its RoPE, window and the rest it adds are read by gemma.
var gemma3Family = family{arch: "Gemma3ForCausalLM", maxPositions: 131072, headDim: 256, eps: 1e-6, tied: true, gelu: true,
	bias: attentionBias, qkNorm: true, rope: (*fields).gemma}

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
