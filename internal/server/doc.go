// Package server is the engine process of `tandem serve`: one model behind
// an OpenAI-compatible HTTP API, from loading the weights to the drain on
// shutdown.
//
// New takes a Config, a plain struct whose fields are the flags of `tandem
// serve` (each field's doc names its flag), and Run assembles and runs the
// process: the tokenizer and the model (or a simulated one, internal/sim),
// the KV cache sized from the flags or from the memory this process may use
// (a cgroup's limit when it is below the machine's), the engine
// (internal/engine), its KV connector and side channel for disaggregated
// prefill/decode (internal/kvconnector), the KV cache events publisher
// (internal/kvevents), the metrics, and the HTTP server (internal/openai,
// plus the engine's admin route for its prefill cadence, cadence.go).
// When Run's context ends, the engine drains as drain.go describes, for
// Kubernetes and any other orchestrator that stops a pod with a signal and
// a grace period.
//
// The command (cmd/tandem) keeps what belongs to a process rather than to
// an engine: the flags, the files they name, the signals and the exit
// status. Tests run engines in-process through New, Ready and Addr.
package server
