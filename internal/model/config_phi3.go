package model

import (
	"encoding/json"
	"fmt"
	"math"
)

// phi3Family is phi3 (Phi3ForCausalLM: Phi-3, Phi-3.5-mini, Phi-4-mini),
// with the defaults of transformers' Phi3Config: q, k and v in one fused
// qkv_proj, gate and up in one gate_up_proj, RoPE on the first
// partial_rotary_factor of each head, longrope scaling, every layer
// windowed when sliding_window is set.
var phi3Family = family{arch: "Phi3ForCausalLM", maxPositions: 4096, eps: 1e-5, bias: noBias, rope: (*fields).phi3Rope, extra: (*fields).phi3Window}

// phi3Rope reads the RoPE base, scaling and rotary width of a phi3 config
// (rope_theta and rope_scaling, or transformers 5's rope_parameters;
// partial_rotary_factor at the top or in rope_parameters). Phi3Config
// knows "default" and "longrope" ("su" and "yarn" are old names of
// longrope).
func (f *fields) phi3Rope(c *Config) error {
	var sub *fields
	for _, name := range []string{"rope_parameters", "rope_scaling"} {
		if !f.has(name) {
			continue
		}
		var err error
		if sub, err = parseFields(f.file, f.m[name]); err != nil {
			return f.typeErr(name, "an object or null")
		}
		sub.file = f.file + " " + name
		break
	}
	typ := ""
	if sub != nil {
		var err error
		if typ, err = sub.stringField("rope_type", ""); err != nil {
			return err
		}
		if typ == "" {
			if typ, err = sub.stringField("type", ""); err != nil {
				return err
			}
		}
	}
	var err error
	switch typ {
	case "", "default":
		if c.RopeTheta, _, err = f.rope(10000); err != nil {
			return err
		}
	case "longrope", "su", "yarn":
		if err := f.longrope(c, sub); err != nil {
			return err
		}
	default:
		return fmt.Errorf("model: %s: field \"rope_type\": rope scaling %q is not supported for phi3 (supported: default, longrope)", sub.file, typ)
	}
	factor := 1.0
	for _, src := range []*fields{sub, f} {
		if src != nil && src.has("partial_rotary_factor") {
			if factor, err = src.floatField("partial_rotary_factor", 1); err != nil {
				return err
			}
			break
		}
	}
	if !(factor > 0 && factor <= 1) {
		return f.typeErr("partial_rotary_factor", "a number in (0, 1]")
	}
	rd := int(float64(c.HeadDim) * factor)
	if rd <= 0 || rd%2 != 0 {
		return fmt.Errorf("model: %s: field \"partial_rotary_factor\": %v of head_dim %d is %d rotary dimensions, expected a positive even number", f.file, factor, c.HeadDim, rd)
	}
	if rd < c.HeadDim {
		c.RotaryDim = rd
	}
	return c.checkLongrope(f.file)
}

// longrope reads a longrope scaling object: short_factor and long_factor
// (one per rotary frequency), factor (default max_position_embeddings /
// original_max_position_embeddings), attention_factor (default
// √(1 + ln factor / ln original)) and original_max_position_embeddings
// (in the object or at the top).
//
// transformers switches to long_factor once a sequence is longer than
// original_max_position_embeddings, which changes the rotation of every
// later key, while the keys already cached keep the short one: no paged,
// batch-invariant cache can reproduce that. Tandem therefore serves a
// longrope model up to original_max_position_embeddings positions, where
// transformers uses short_factor throughout, and limits MaxPositions to it.
func (f *fields) longrope(c *Config, sub *fields) error {
	rs := RopeScaling{Type: "longrope"}
	var err error
	src := sub
	if sub.has("rope_theta") || !f.has("rope_theta") {
		if c.RopeTheta, err = sub.floatField("rope_theta", 10000); err != nil {
			return err
		}
	} else {
		src = f
		if c.RopeTheta, err = f.floatField("rope_theta", 10000); err != nil {
			return err
		}
	}
	if c.RopeTheta <= 1 {
		return src.typeErr("rope_theta", "a number greater than 1")
	}
	orig := sub
	if !sub.has("original_max_position_embeddings") {
		orig = f
	}
	if rs.OriginalMaxPositionEmbeddings, err = orig.posInt("original_max_position_embeddings", 0, true); err != nil {
		return err
	}
	if !sub.has("short_factor") || !sub.has("long_factor") {
		return fmt.Errorf("model: %s: longrope scaling needs short_factor and long_factor", sub.file)
	}
	if err := json.Unmarshal(sub.m["short_factor"], &rs.ShortFactor); err != nil {
		return sub.typeErr("short_factor", "a list of numbers")
	}
	if err := json.Unmarshal(sub.m["long_factor"], &rs.LongFactor); err != nil {
		return sub.typeErr("long_factor", "a list of numbers")
	}
	if rs.Factor, err = sub.floatField("factor", 0); err != nil {
		return err
	}
	if rs.Factor == 0 {
		rs.Factor = float64(c.MaxPositions) / float64(rs.OriginalMaxPositionEmbeddings)
	}
	if rs.AttentionFactor, err = sub.floatField("attention_factor", 0); err != nil {
		return err
	}
	if rs.AttentionFactor == 0 {
		rs.AttentionFactor = 1
		if rs.Factor > 1 {
			rs.AttentionFactor = math.Sqrt(1 + math.Log(rs.Factor)/math.Log(float64(rs.OriginalMaxPositionEmbeddings)))
		}
	}
	if !(rs.AttentionFactor > 0) {
		return sub.typeErr("attention_factor", "a positive number")
	}
	// transformers holds the factors as float32 tensors and scales float32
	// cos and sin by the attention factor; GGUF files store them as f32.
	for i, v := range rs.ShortFactor {
		rs.ShortFactor[i] = float64(float32(v))
	}
	rs.AttentionFactor = float64(float32(rs.AttentionFactor))
	c.RopeScaling = rs
	c.MaxPositions = min(c.MaxPositions, rs.OriginalMaxPositionEmbeddings)
	return nil
}

// checkLongrope checks that a longrope scaling has one short and one long
// factor per rotary frequency, the short ones positive.
func (c *Config) checkLongrope(file string) error {
	rs := &c.RopeScaling
	if rs.Type != "longrope" {
		return nil
	}
	if len(rs.ShortFactor) != c.RotaryDims()/2 || len(rs.LongFactor) != c.RotaryDims()/2 {
		return fmt.Errorf("model: %s: longrope short_factor and long_factor have %d and %d entries, expected one per rotary frequency (%d)", file, len(rs.ShortFactor), len(rs.LongFactor), c.RotaryDims()/2)
	}
	for i, v := range rs.ShortFactor {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("model: %s: longrope short_factor[%d] = %v: expected a positive number", file, i, v)
		}
	}
	return nil
}

// phi3Window reads sliding_window: the window of every layer (null:
// none). A window as long as the positions served is none.
func (f *fields) phi3Window(c *Config) error {
	w, err := f.intField("sliding_window", 0, false)
	if err != nil {
		return err
	}
	if w < 0 {
		return f.typeErr("sliding_window", "a positive integer or null")
	}
	if w < c.MaxPositions {
		c.SlidingWindow = w
	}
	return nil
}

// RotaryDims is the number of leading dimensions of each query and key
// head that RoPE rotates: RotaryDim, or the whole head.
func (c *Config) RotaryDims() int {
	if c.RotaryDim > 0 {
		return c.RotaryDim
	}
	return c.HeadDim
}
