package model

import (
	"encoding/json"
	"fmt"
	"slices"
)

// smolLM3Family is smollm3 (SmolLM3ForCausalLM), with the defaults of
// transformers' SmolLM3Config: a Llama whose every
// no_rope_layer_interval-th layer has no rotary embedding (NoPE), a RoPE
// base of 2e6 and a tied head.
var smolLM3Family = family{arch: "SmolLM3ForCausalLM", maxPositions: 32768, eps: 1e-6, tied: true, bias: attentionBias,
	rope: func(f *fields, c *Config) error {
		var err error
		c.RopeTheta, c.RopeScaling, err = f.rope(2e6)
		return err
	},
	extra: (*fields).smolLM3}

// smolLM3 reads which layers have no RoPE (no_rope_layers: 1 for a layer
// with RoPE, 0 without, at least one entry per layer; or, without it, every
// no_rope_layer_interval-th layer without) and the window as
// SmolLM3Config applies it: with use_sliding_window and sliding_window, the
// layers layer_types marks "sliding_attention" or, without layer_types,
// the NoPE layers.
func (f *fields) smolLM3(c *Config) error {
	var noRope []int
	if f.has("no_rope_layers") {
		var flags []int
		if err := json.Unmarshal(f.m["no_rope_layers"], &flags); err != nil || len(flags) < c.Layers {
			return f.typeErr("no_rope_layers", fmt.Sprintf("a list of at least %d flags (1: the layer has RoPE, 0: it has none)", c.Layers))
		}
		for i, v := range flags[:c.Layers] {
			switch v {
			case 0:
				noRope = append(noRope, i)
			case 1:
			default:
				return fmt.Errorf("model: %s: field \"no_rope_layers\": layer %d has flag %d, expected 1 (RoPE) or 0 (none)", f.file, i, v)
			}
		}
	} else {
		interval, err := f.posInt("no_rope_layer_interval", 4, false)
		if err != nil {
			return err
		}
		for i := range c.Layers {
			if (i+1)%interval == 0 {
				noRope = append(noRope, i)
			}
		}
	}
	c.NoRopeLayers = noRope
	use, err := f.boolField("use_sliding_window", false)
	if err != nil {
		return err
	}
	w, err := f.intField("sliding_window", 0, false)
	if err != nil {
		return err
	}
	if w < 0 {
		return f.typeErr("sliding_window", "a positive integer or null")
	}
	if !use || w == 0 {
		if f.has("layer_types") && w > 0 {
			// transformers would mask those layers to the window yet
			// treat them as full-attention ones otherwise.
			if types, err := f.layerTypes(c.Layers); err != nil {
				return err
			} else if slices.Contains(types, "sliding_attention") {
				return fmt.Errorf("model: %s: field \"layer_types\": sliding_attention layers with use_sliding_window false are ambiguous; set use_sliding_window true (or the layers to full_attention)", f.file)
			}
		}
		return nil
	}
	c.SlidingWindow = w
	if f.has("layer_types") {
		full, err := f.fullAttentionLayers(c.Layers)
		c.FullLayers = append(c.FullLayers, full...)
		return err
	}
	for i := range c.Layers {
		if !slices.Contains(noRope, i) {
			c.FullLayers = append(c.FullLayers, i)
		}
	}
	return nil
}

// LayerRope reports whether layer i applies rotary embeddings to its
// queries and keys (false for SmolLM3's NoPE layers).
func (c *Config) LayerRope(i int) bool { return !slices.Contains(c.NoRopeLayers, i) }
