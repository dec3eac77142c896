// Package model loads Llama-family decoders (model_type llama, mistral,
// qwen2, qwen3, gemma3_text, smollm3, phi3 and the mixture-of-experts
// qwen3_moe and mixtral) from Hugging Face checkpoints and runs them on the
// CPU. Each family's config.json is read by its own file (config_llama.go,
// config_moe.go, config_gemma.go, config_smollm3.go, config_phi3.go) over
// the shared field reading of config_fields.go.
//
// Load reads config.json and generation_config.json, loads the safetensors
// weights into read-only anonymous memory (see safetensors.Open for why not a
// file mapping; bf16 and f16 stay in their dtype and are widened
// inside the kernels of internal/tensor) and checks every tensor's shape.
// Model.Forward runs a batch of sequences over a paged KV pool whose layout
// is a kvlayout.Layout: all new tokens of all sequences share every weight
// matmul, attention reads each sequence's blocks through its block table.
// The package computes; it never allocates KV blocks or schedules requests.
//
// Load also takes a GGUF file (LoadGGUF, package gguf): the llama, qwen2,
// qwen3, qwen3moe, gemma3, smollm3 and phi3 architectures with F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K tensors,
// quantized matrices kept as their blocks (tensor.Mat.Q). ConvertToGGUF
// writes a checkpoint as a GGUF file in any of GGUFEncodings.
//
// Batch invariance is a design invariant: a sequence's logits are
// bit-identical whatever else is in the batch and however its prompt is
// chunked, so prefill on one engine and decode on another reproduce a
// single engine exactly. A mixture-of-experts layer keeps it: each token's
// routing is computed from its own row, the tokens an expert serves are
// gathered into one matmul whose rows do not depend on each other, and each
// token sums its experts' outputs in expert-id order.
package model
