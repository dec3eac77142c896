// Package e2e holds end-to-end tests that run the real tandem binary as
// separate processes — a colocated reference engine, prefill and decode
// engines, and the proxy in front — and check what users of the
// disaggregated path rely on: the proxy's answers are bit-identical to one
// colocated engine's, the prompt's KV really came over the side channel,
// every KV block returns to its pool, and failures (a prefill killed or
// restarted, engines started with different block sizes) end in bounded time
// with a clear answer. TestContract walks the arcs of the P/D transfer
// contract (docs/kv-transfer.md): a fault in each phase of a request, on
// simulated engines behind relays the test holds legs at.
//
// The package has no non-test code. The tests build the binary once per run
// and skip in -short mode; they need the shared test models (see
// internal/testmodels).
package e2e
