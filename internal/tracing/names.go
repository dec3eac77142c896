package tracing

import "go.opentelemetry.io/otel/attribute"

// Span names. The proxy's spans start with "proxy.", the engines' with
// "engine.".
const (
	// SpanProxyRequest is the proxy's server span of one completion or chat
	// request, from its arrival to the end of its answer.
	SpanProxyRequest = "proxy.request"
	// SpanProxyRoute is the route decision: the decode picked and whether
	// the prompt is prefilled remotely, and why.
	SpanProxyRoute = "proxy.route"
	// SpanProxyPrefillLeg is one attempt of the prefill leg (a retry is a
	// span of its own, with AttrAttempt; a failed one has AttrFailureReason).
	SpanProxyPrefillLeg = "proxy.prefill_leg"
	// SpanProxyDecodeLeg is one attempt of the decode leg, until its answer
	// is relayed whole (a retry is a span of its own).
	SpanProxyDecodeLeg = "proxy.decode_leg"
	// SpanProxyFallback is the decode leg run alone after a failed prefill
	// leg, with AttrFallbackReason.
	SpanProxyFallback = "proxy.fallback"

	// SpanEngineRequest is an engine's server span of one request, the
	// child of the leg that sent it.
	SpanEngineRequest = "engine.request"
	// SpanEngineQueue is the wait from arrival to admission (vLLM's
	// queued time).
	SpanEngineQueue = "engine.queue"
	// SpanEngineKVPull is, on a decode engine, the load of the prompt's KV
	// from the prefill engine that holds it.
	SpanEngineKVPull = "engine.kv_pull"
	// SpanEngineKVReady is the wait from a KV pull's end to the step that
	// first ran the request.
	SpanEngineKVReady = "engine.kv_ready"
	// SpanEnginePrefill is the compute of the uncached prompt up to the
	// first token.
	SpanEnginePrefill = "engine.prefill"
	// SpanEngineDecode is from the first token to the request's end.
	SpanEngineDecode = "engine.decode"

	// EventFirstToken marks the first token on SpanEngineRequest, and the
	// decode leg's first byte on SpanProxyDecodeLeg.
	EventFirstToken = "first_token"
	// EventKVHeld marks, on a prefill engine's SpanEngineRequest, that the
	// prompt's KV is held for a remote decode (until it is pulled, released
	// or its lease expires).
	EventKVHeld = "kv_held"
)

// Attribute keys: OpenTelemetry's GenAI semantic conventions where they
// exist, vLLM's (gen_ai.latency.*) where Tandem mirrors vLLM, and Tandem's
// own under "tandem.".
const (
	AttrOperationName  = attribute.Key("gen_ai.operation.name") // "chat" or "text_completion"
	AttrRequestModel   = attribute.Key("gen_ai.request.model")
	AttrResponseModel  = attribute.Key("gen_ai.response.model")
	AttrRequestMaxToks = attribute.Key("gen_ai.request.max_tokens")
	AttrRequestN       = attribute.Key("gen_ai.request.n")
	AttrRequestID      = attribute.Key("gen_ai.request.id") // vLLM's
	AttrInputTokens    = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens   = attribute.Key("gen_ai.usage.output_tokens")
	AttrTimeInQueue    = attribute.Key("gen_ai.latency.time_in_queue")       // vLLM's, seconds
	AttrTimeToFirstTok = attribute.Key("gen_ai.latency.time_to_first_token") // vLLM's, seconds
	AttrTimeInPrefill  = attribute.Key("gen_ai.latency.time_in_model_prefill")
	AttrTimeInDecode   = attribute.Key("gen_ai.latency.time_in_model_decode")
	AttrE2E            = attribute.Key("gen_ai.latency.e2e")
	AttrServerAddress  = attribute.Key("server.address")
	AttrHTTPStatus     = attribute.Key("http.response.status_code")
	AttrHTTPRoute      = attribute.Key("http.route")
	AttrErrorType      = attribute.Key("error.type")
	AttrRole           = attribute.Key("tandem.role")            // prefill, decode or both
	AttrPolicy         = attribute.Key("tandem.router.policy")   // the picking pipeline
	AttrPDDecision     = attribute.Key("tandem.pd.decision")     // remote, local or fallback
	AttrPDReason       = attribute.Key("tandem.pd.reason")       // the decider's or the fallback's reason
	AttrPDPath         = attribute.Key("tandem.pd")              // the X-Tandem-Pd answer header
	AttrOutcome        = attribute.Key("tandem.outcome")         // the request's outcome label
	AttrDecodeBackend  = attribute.Key("tandem.decode.backend")  // the decode picked
	AttrAttempt        = attribute.Key("tandem.attempt")         // 0 for a leg's first attempt
	AttrFailureReason  = attribute.Key("tandem.failure.reason")  // why this attempt failed
	AttrFallbackReason = attribute.Key("tandem.fallback.reason") // why the prefill leg failed
	AttrKVRemoteEngine = attribute.Key("tandem.kv.remote_engine_id")
	AttrKVRemoteHost   = attribute.Key("tandem.kv.remote_host")
	AttrKVBlocks       = attribute.Key("tandem.kv.blocks")
	AttrKVPulledTokens = attribute.Key("tandem.kv.tokens")
	AttrKVTransport    = attribute.Key("tandem.kv.transport")
)
