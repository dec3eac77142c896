package model

import (
	"math"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// Gemma 3's element-wise operations: each output element depends only on
// its own inputs, so batching and chunking change no result.

// scaleEmbedding multiplies an embedding row (read from a matrix of dtype
// dt) by √hidden as transformers' Gemma3TextScaledWordEmbedding does: in
// the embedding's dtype, the scale rounded to it and each product rounded
// to it (for bf16 and f16 weights), or in f32.
func scaleEmbedding(x []float32, hidden int, dt tensor.DType) {
	scale := float32(math.Sqrt(float64(hidden)))
	switch dt {
	case tensor.BF16:
		scale = tensor.BF16ToF32(tensor.F32ToBF16(scale))
		for i, v := range x {
			x[i] = tensor.BF16ToF32(tensor.F32ToBF16(v * scale))
		}
	case tensor.F16:
		scale = tensor.F16ToF32(tensor.F32ToF16(scale))
		for i, v := range x {
			x[i] = tensor.F16ToF32(tensor.F32ToF16(v * scale))
		}
	default:
		for i, v := range x {
			x[i] = v * scale
		}
	}
}

// geluTanhMul computes gate[i] = gelu(gate[i])·up[i] with the tanh
// approximation of GELU (PyTorch's gelu(approximate="tanh"), Gemma's
// gelu_pytorch_tanh): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), each
// element in float64 and rounded once.
func geluTanhMul(gate, up []float32) {
	const k = 0.7978845608028654 // √(2/π)
	up = up[:len(gate)]
	for i, v := range gate {
		x := float64(v)
		g := 0.5 * x * (1 + math.Tanh(k*(x+0.044715*x*x*x)))
		gate[i] = float32(g) * up[i]
	}
}

// softcap caps logits smoothly at ±c: c·tanh(l/c) (Gemma's
// final_logit_softcapping), each in float64 and rounded once.
func softcap(logits []float32, c float32) {
	cf := float64(c)
	for i, v := range logits {
		logits[i] = float32(cf * math.Tanh(float64(v)/cf))
	}
}
