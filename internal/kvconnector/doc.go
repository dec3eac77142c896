// Package kvconnector puts Tandem's P/D KV transfer inside an engine. Its
// Connector is both halves of a vLLM-style KV connector: the scheduler half
// (sched.Connector: what to load for a remote prefill, what to hold for a
// remote decode) and the worker half (engine.KVWorker: pulls,
// notifications, lease releases), built on kvxfer's Producer and Consumer.
//
// kv_transfer_params are parsed once, at Submit, into typed params
// (CheckKVTransfer refuses malformed ones with a 400 before anything is
// allocated); the scheduler half keeps a per-request phase machine
// (waiting for blocks → loading → consumed) driven by the step loop.
//
// The wire protocol, lifecycles and failure semantics are in
// docs/kv-transfer.md.
package kvconnector
