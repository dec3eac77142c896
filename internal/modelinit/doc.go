// Package modelinit writes random-weight Llama-family models in Hugging
// Face layout (config.json, generation_config.json, model.safetensors and a
// tokenizer), so that benchmarks and tests can run real architectures —
// SmolLM2-135M, Llama-3.2-1B — without downloading weights.
//
// Output is a pure function of the Spec and the seed: every tensor draws
// from its own generator keyed by the seed and the tensor's name, so files
// are byte-identical across runs and machines.
package modelinit
