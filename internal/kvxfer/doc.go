// Package kvxfer is Tandem's prefill/decode KV connector: it moves a
// request's prompt KV blocks from the prefill engine that computed them to
// the decode engine that continues the request.
//
// The prefill side is a Producer. When a request meant for remote decode
// finishes, the engine's step loop calls Producer.Hold: the blocks stay
// allocated under a lease (DefaultLease, extended by heartbeats) and are
// served on a TCP side channel (Serve). The producer never frees a block:
// each step the step loop calls Sweep and TakeReleased and frees the
// requests whose decode sent DONE or whose lease expired.
//
// The decode side is a Consumer. Pull handshakes with the producer (once
// per engine, shared by concurrent requests; model and KV geometry must
// match), reads the blocks straight into local block memory — over TCP, or
// from a read-only mapping of the producer's pool file when both engines
// are on one host — and sends DONE. Watch keeps a queued request's lease
// alive with heartbeats. A block reused while it is read is detected by
// its generation counter and fails the pull instead of yielding wrong KV.
//
// This package is the trust boundary of the P/D path and links neither the
// engine nor the scheduler nor the model and its kernels (the KV geometry
// it checks is package kvlayout's; internal/deps_test.go keeps it so):
// everything a peer sends is checked here. The
// engine-facing connector that drives a Producer and a Consumer from the
// step loop is package kvconnector.
//
// The wire protocol, versioning rules, lifecycles and failure semantics are
// specified in docs/kv-transfer.md.
package kvxfer
