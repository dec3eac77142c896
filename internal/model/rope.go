package model

import "math"

// ropeInvFreq returns the rotary inverse frequencies θ^(-2i/d) for
// i < d/2, d the rotated dimensions of a head (RotaryDims), rescaled as the
// config's rope_scaling asks, following the Hugging Face definitions
// (modeling_rope_utils).
func ropeInvFreq(c *Config) []float64 {
	d := c.RotaryDims()
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(d))
	}
	rs := c.RopeScaling
	switch rs.Type {
	case "longrope":
		// The short factors: Tandem serves a longrope model up to
		// original_max_position_embeddings positions (see
		// fields.longrope).
		for i := range inv {
			inv[i] /= rs.ShortFactor[i]
		}
	case "linear":
		// Positions divided by factor, i.e. frequencies divided by it.
		for i := range inv {
			inv[i] /= rs.Factor
		}
	case "llama3":
		orig := float64(rs.OriginalMaxPositionEmbeddings)
		lowWavelen := orig / rs.LowFreqFactor
		highWavelen := orig / rs.HighFreqFactor
		for i, f := range inv {
			wavelen := 2 * math.Pi / f
			switch {
			case wavelen < highWavelen:
				// High frequencies are kept.
			case wavelen > lowWavelen:
				inv[i] = f / rs.Factor
			default:
				smooth := (orig/wavelen - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
				inv[i] = (1-smooth)*f/rs.Factor + smooth*f
			}
		}
	}
	return inv
}

// ropeRow fills cos and sin (one per frequency) for position pos, each
// multiplied by scale (longrope's attention factor, else 1). The angle is
// computed in float64 and rounded once, so a position's table row is the
// same bits whichever batch or chunk computes it.
//
// Forward builds the rows for the positions of its batch once and shares
// them across every layer and head, instead of keeping a table for every
// position: for Llama-3.2-1B (131072 positions × 32 frequencies) that table
// would be 32 MiB, while the per-step rows cost HeadDim/2 sincos per token.
func ropeRow(invFreq []float64, scale float64, pos int, cos, sin []float32) {
	for i, f := range invFreq {
		s, c := math.Sincos(float64(pos) * f)
		cos[i], sin[i] = float32(c*scale), float32(s*scale)
	}
}

// ropeScale is the factor cos and sin are multiplied by: longrope's
// attention factor, else 1.
func ropeScale(c *Config) float64 {
	if c.RopeScaling.Type == "longrope" {
		return c.RopeScaling.AttentionFactor
	}
	return 1
}

// applyRope rotates one head vector x in place with the rotate-half
// convention used by Hugging Face Llama: pairs (x[i], x[i+d/2]) for d =
// 2·len(cos), the dimensions past d (partial rotary) left as they are.
func applyRope(x, cos, sin []float32) {
	half := len(cos)
	x1, x2 := x[:half], x[half:2*half]
	for i := range half {
		a, b := x1[i], x2[i]
		x1[i] = a*cos[i] - b*sin[i]
		x2[i] = b*cos[i] + a*sin[i]
	}
}
