// Package sample turns one row of model logits into the next token of a
// request, the way vLLM does: logit bias, min_tokens (stop tokens masked),
// repetition / presence / frequency penalties, temperature, top-k, top-p
// (nucleus) and min-p, then a draw from the request's own seeded random
// stream. It also computes OpenAI-style logprobs of the raw model
// distribution (vLLM's default "raw_logprobs"), validates sampling
// parameters under their OpenAI names, and finds stop strings across token
// boundaries (StopChecker).
//
// The filters run in the order of vLLM's V0 sampler: top-k, then top-p, then
// min-p. (vLLM V1 applies min-p before top-k and top-p; the two orders keep
// different sets only when top-p and min-p are both set.)
//
// A Sampler belongs to one request and is used from one goroutine (the
// engine's step loop). Each Sample call consumes exactly one uniform draw from
// the Sampler's PCG stream whatever the parameters, so a request's tokens
// depend only on its own logits and seed, never on what else is batched with
// it. Distinct Samplers share no mutable state, so an engine may also sample
// several requests in parallel. Large per-call buffers (a copy of the
// logits, weights, candidate lists, token counts) come from a shared free
// list rather than from each Sampler, so thousands of concurrent requests do
// not each hold vocabulary-sized arrays, and a call in steady state
// allocates nothing but its Logprob.
//
// Costs per call for a vocabulary V. Per-token arithmetic runs in the
// tensor package's vector kernels (the exponential, tensor.ExpSum; the
// temperature scaling, tensor.Axpy; block sums for a draw, tensor.Dot), so,
// like the logits themselves, the exact floats depend on the ISA tensor
// runs with. The Go loops over the whole row are compare-only scans that
// look closer at the rare groups of tokens that pass, except top-p's one
// collecting pass.
//   - Greedy without logprobs is one compare pass over the caller's logits,
//     with no copy.
//   - Logprobs are one vector exponential pass over the raw logits (shifted
//     by a sampled estimate of their maximum, not the maximum: that saves a
//     pass) and a top-N search that reads only the blocks of 512 logits
//     whose exponentials sum to enough to hold a top-N entry.
//   - Sampling computes the weights with one more vector exponential pass,
//     or reuses the logprobs' at temperature 1. A draw without top-k and
//     top-p sums 256-token blocks with tensor.Dot and walks one block.
//   - Top-k keeps a size-k heap during one compare pass (quickselect beyond
//     k = 256) and exponentiates only the k candidates.
//   - Top-p collects the tokens above a floor estimated from a sample of
//     the weights and checked exactly (a provable bound is the fallback),
//     then finds the nucleus's cut and draws from it with a radix
//     selection on the candidates' weights: no sort, no partition.
package sample
