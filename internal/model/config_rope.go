package model

import (
	"fmt"
)

// RopeScaling describes how rotary frequencies are rescaled for long
// contexts. Type is "" (none), "linear", "llama3" or "longrope"; or, for a GGUF file
// with a rope_freqs tensor (how llama.cpp stores Llama 3 scaling), "freqs":
// each frequency is divided by that tensor's factor.
type RopeScaling struct {
	Type   string
	Factor float64
	// llama3 only.
	LowFreqFactor  float64
	HighFreqFactor float64
	// llama3 and longrope.
	OriginalMaxPositionEmbeddings int
	// longrope only (phi3): each rotary frequency is divided by its
	// ShortFactor, and cos and sin are multiplied by AttentionFactor.
	ShortFactor     []float64
	AttentionFactor float64
	// LongFactor are longrope's factors past the original length; Tandem
	// does not compute with them but writes them to GGUF files.
	LongFactor []float64
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
// fields in one object, rope_type "default" for none); def is the base
// when neither names one.
func (f *fields) rope(def float64) (float64, RopeScaling, error) {
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
		theta, err := src.floatField(name, def)
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
	theta, err := f.floatField(name, def)
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
func (f *fields) scaling() (RopeScaling, error) {
	var err error
	var rs RopeScaling
	if rs.Type, err = f.stringField("rope_type", ""); err != nil {
		return rs, err
	}
	if rs.Type == "" {
		if rs.Type, err = f.stringField("type", ""); err != nil {
			return rs, err
		}
	}
	switch rs.Type {
	case "default":
		return RopeScaling{}, nil
	case "linear", "llama3":
	case "":
		return rs, fmt.Errorf("model: %s: field \"rope_type\" (or \"type\") is missing", f.file)
	default:
		return rs, fmt.Errorf("model: %s: field \"rope_type\": rope scaling %q is not supported (supported: default, linear, llama3)", f.file, rs.Type)
	}
	if rs.Factor, err = f.floatField("factor", 0); err != nil {
		return rs, err
	}
	if rs.Factor <= 0 {
		return rs, fmt.Errorf("model: %s: field \"factor\": expected a positive number, found %v", f.file, rs.Factor)
	}
	if rs.Type == "llama3" {
		if rs.LowFreqFactor, err = f.floatField("low_freq_factor", 0); err != nil {
			return rs, err
		}
		if rs.HighFreqFactor, err = f.floatField("high_freq_factor", 0); err != nil {
			return rs, err
		}
		if rs.OriginalMaxPositionEmbeddings, err = f.posInt("original_max_position_embeddings", 0, true); err != nil {
			return rs, err
		}
		if rs.LowFreqFactor <= 0 || rs.HighFreqFactor <= rs.LowFreqFactor {
			return rs, fmt.Errorf("model: %s: expected 0 < low_freq_factor < high_freq_factor, found %v and %v", f.file, rs.LowFreqFactor, rs.HighFreqFactor)
		}
	}
	return rs, nil
}
