package model

import (
	"encoding/json"
	"fmt"
	"strings"
)

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
