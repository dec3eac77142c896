// Package bench is a serving benchmark for OpenAI-compatible completion
// endpoints, in the manner of vLLM's benchmarks/benchmark_serving.py. It
// sends streaming /v1/completions requests whose prompts are exactly
// PromptTokens random token ids and whose outputs are exactly MaxTokens
// tokens (ignore_eos), either in a closed loop at a fixed concurrency or with
// Poisson arrivals at a given rate, and reports throughput and the
// distributions of time to first token (TTFT), time per output token (TPOT),
// inter-token latency (ITL, per streamed chunk) and end-to-end latency.
//
// The workload is a pure function of the seed, so two runs (or two servers)
// see the same prompts in the same order.
package bench
