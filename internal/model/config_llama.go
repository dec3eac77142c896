package model

// The dense Llama-family model types (the sliding window of mistral, qwen2
// and qwen3 is read by slidingWindow).
var (
	llamaFamily   = family{arch: "LlamaForCausalLM", maxPositions: 2048, eps: 1e-6, bias: attentionBias, rope: readRope}
	mistralFamily = family{arch: "MistralForCausalLM", maxPositions: 2048, eps: 1e-6, bias: noBias, rope: readRope}
	qwen2Family   = family{arch: "Qwen2ForCausalLM", maxPositions: 2048, eps: 1e-6, bias: qkvBias, rope: readRope}
	qwen3Family   = family{arch: "Qwen3ForCausalLM", maxPositions: 2048, eps: 1e-6, bias: attentionBias, qkNorm: true, rope: readRope}
)
