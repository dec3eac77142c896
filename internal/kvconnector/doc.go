// Package kvconnector puts Tandem's P/D KV transfer inside an engine. Its
// Connector is both halves of a vLLM-style KV connector: the scheduler half
// (sched.Connector: what to load for a remote prefill, what to hold for a
// remote decode) and the worker half (engine.KVWorker: pulls,
// notifications, lease releases), built on kvxfer's Producer and Consumer.
//
// kv_transfer_params are parsed once, where they enter the engine (the API
// layer, into kvparams.Params), and checked once, at Submit:
// CheckKVTransfer refuses inconsistent ones with a 400 before anything is
// allocated or dialed, and what it made of them rides on the request
// (sched.Request.KVParams) to the scheduler half, which keeps a
// per-request phase machine (waiting for blocks → loading → consumed)
// driven by the step loop. The scheduler half hands each step's work to
// the worker half as a sched.ConnectorMeta.
//
// The wire protocol, lifecycles and failure semantics are in
// docs/kv-transfer.md.
package kvconnector
