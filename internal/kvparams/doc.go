// Package kvparams is the one typed home of kv_transfer_params, the JSON
// object a disaggregated request carries between a proxy, a prefill engine
// and a decode engine: vLLM's fields (its NIXL connector's) and Tandem's
// own, each spelled once, in Params' JSON tags.
//
// Parse turns the object into Params where it enters an engine, refusing a
// field of the wrong type or range with a *FieldError that names it; keys
// it does not know are kept verbatim in Params.Extra and written back by
// MarshalJSON, so params pass through Tandem unchanged. What the fields
// mean for a request (which must be set together, what they must match) is
// decided by the engine's KV connector, not here.
//
// The package uses only the standard library, so the proxy can read params
// (a conversation's expiry) and write them (the prefill leg's request)
// without linking the engine.
package kvparams
