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
// several requests in parallel. Large per-call buffers (a copy of the logits, weights, candidate lists,
// token counts) come from a shared pool rather than from each Sampler, so
// thousands of concurrent requests do not each hold vocabulary-sized arrays.
//
// Costs per call for a vocabulary V: greedy without logprobs is one pass
// over the caller's logits, with no copy. Sampling evaluates one exponential
// per token (a float32 polynomial, exp32, about twice as fast as math.Exp)
// and reuses the logprobs pass's exponentials at temperature 1. Top-k uses a
// size-k heap (quickselect beyond k = 256) rather than a sort; top-p finds
// the nucleus by partitioning on probability mass (expected O(V)) and only
// sorts groups of tied probabilities; logprobs are one max/top-N pass and
// one log-sum-exp pass over the raw logits.
package sample
