// Package sample turns one row of model logits into the next token of a
// request, the way vLLM does: logit bias, min_tokens, repetition / presence /
// frequency penalties, temperature, top-k, top-p (nucleus) and min-p, then a
// draw from the request's own seeded random stream. It also computes
// OpenAI-style logprobs, validates sampling parameters with OpenAI parameter
// names, and detects stop strings across token boundaries (StopChecker).
//
// A Sampler belongs to one request and is used from one goroutine (the
// engine's step loop). Each Sample call consumes exactly one uniform draw from
// the Sampler's PCG stream whatever the parameters, so a request's tokens
// depend only on its own logits and seed, never on what else is batched with
// it. Large per-call buffers (a copy of the logits, candidate lists, token
// counts) come from a shared pool rather than from each Sampler, so thousands
// of concurrent requests do not each hold vocabulary-sized arrays.
//
// Costs per call for a vocabulary V: greedy is one pass; top-k uses a
// size-k heap (or quickselect for large k) rather than a sort; top-p finds the
// nucleus by partitioning on probability mass (expected O(V)) and only sorts
// groups of tied probabilities; logprobs are one max/top-N pass and one
// log-sum-exp pass over the raw logits.
package sample
