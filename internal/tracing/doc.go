// Package tracing is Tandem's OpenTelemetry tracing: the tracer provider
// (the OTLP/HTTP exporter, the sampler, the service name), W3C trace-context
// propagation over HTTP headers, and the span and attribute names every
// process uses, defined once here.
//
// Tracing is off unless configured: Setup with an empty endpoint and no
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or OTEL_EXPORTER_OTLP_ENDPOINT)
// installs nothing, and Start then returns its context unchanged and a
// span that records nothing, without allocating. Callers build attributes
// only when Span.IsRecording says the span keeps them.
//
// One P/D request makes one trace: the proxy's server span (SpanProxyRequest)
// holds the route decision, each prefill and decode leg attempt (retries and
// fallbacks are spans of their own, with their reasons), and each leg's
// traceparent header makes the engine's server span (SpanEngineRequest) its
// child. The engine's phases (queue, KV pull, prefill compute, decode) are
// recorded from the timestamps the engine keeps and emitted when the request
// ends, so the step loop does no tracing work.
package tracing
