package model

import (
	"encoding/json"
	"fmt"
	"slices"
)

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

// The mixture-of-experts model types (mixtral's window is read by
// slidingWindow).
var (
	mixtralFamily = family{arch: "MixtralForCausalLM", maxPositions: 2048, eps: 1e-6, bias: noBias, rope: readRope,
		extra: func(f *fields, c *Config) (err error) {
			c.MoE, err = f.mixtral(c)
			return err
		}}
	qwen3MoEFamily = family{arch: "Qwen3MoeForCausalLM", maxPositions: 2048, eps: 1e-6, bias: attentionBias, qkNorm: true, rope: readRope,
		extra: func(f *fields, c *Config) (err error) {
			c.MoE, err = f.moe(c)
			return err
		}}
)

// SparseLayer reports whether layer i has a mixture-of-experts
// feed-forward block, following transformers' Qwen3MoeDecoderLayer.
func (c *Config) SparseLayer(i int) bool {
	e := &c.MoE
	return e.Experts > 0 && e.SparseStep > 0 && (i+1)%e.SparseStep == 0 && !slices.Contains(e.DenseLayers, i)
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
