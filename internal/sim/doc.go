// Package sim is a simulated model for Tandem engines: an
// engine.Forwarder that sleeps for the time a time model gives instead of
// computing, so that hundreds of real engines — same HTTP API, scheduler,
// paged KV cache with prefix caching, KV connector, leases, side channel
// and transports, metrics — run on one small machine (`tandem serve
// --simulate`, `tandem up --simulate`). Only model.Model.Forward is
// replaced.
//
// Outputs. The logits for the token after position p are a fixed row
// rotated by a hash of the seed, p and the tokens at p-7..p: a function of
// the request only, so greedy and seeded answers are reproducible and the
// same colocated or disaggregated, batched or alone (batch invariance by
// construction). Sampling is the engine's own. Only the tokenizer's
// printable tokens are made likely (Config.Choices), and EOS is chosen,
// deterministically, once in Config.MeanOutputLen tokens on average.
//
// KV bytes. Every new token's K and V rows, every layer, get a pattern of
// (token, position, layer, K|V, element) written as raw bits (pattern.go),
// so real bytes move between engines. Two checks read them back:
//
//   - When a KV connector reports a load (a decode's pull from a prefill)
//     finished, the engine asks the model (engine.KVChecker) before the
//     scheduler uses the blocks; wrong blocks are reported as failed
//     blocks, so --kv-load-failure-policy decides: fail ends the request
//     with an error naming the block, recompute computes the prompt again
//     from the first bad block (which is also dropped from the prefix
//     cache).
//   - At the step that computes a request's last prompt token, the model
//     checks every earlier position (prefix-cache hits and pulled blocks
//     alike); a mismatch fails that request only (model.SeqErrors). This
//     catches what no load reported: a wrong block table, a stale
//     prefix-cache block.
//
// The KV shape is small (2 layers, 2 KV heads, head dim 8, bf16: 2 KiB per
// 16-token block) and the model's fingerprint names it, so a simulated
// engine never exchanges KV with a real one.
//
// Time. A TimeModel maps a step's shape (Batch: prompt tokens, decodes and
// their context) to a duration: a Profile measured by `tandem profile` on
// the real forward pass and interpolated (piecewise linear in prompt
// tokens; in context then batch size for decodes; mixed steps costed as
// all their tokens through the prefill curve plus the decodes' extra
// attention; a prompt chunk after position 0 adds its attention over the
// earlier context, read off the prefill curve, so that a chunked prompt
// costs at least its one-shot prefill), or Knobs (--sim-ttft, --sim-itl,
// --sim-prefill-per-token).
// Config.Speed divides every simulated duration. The step loop sleeps in
// Forward, so it is busy exactly as long as a real one would be and
// everything around it (queueing, batching, transfers) is real.
//
// Faults (Faults): failed requests, step-loop stalls, slow, failing and
// damaged KV loads, and a crash after N requests, all injected at the
// simulated model's own boundary — the engine and the KV transfer code are
// the production ones.
package sim
