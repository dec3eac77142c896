// Package jaegertest runs a real Jaeger (v2: the jaeger binary, an
// OpenTelemetry Collector with Jaeger's storage and query extensions) for
// tests: it receives spans over OTLP/HTTP, keeps them in memory, and
// answers Jaeger's query API (/api/traces/{id}).
//
// The binary is built at a pinned version by scripts/jaeger-binary.sh,
// which caches it under ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/jaeger/;
// CI exports its path as $TANDEM_JAEGER. Where it is missing, Start skips
// the test with the script's name, or fails it when TANDEM_REQUIRE_TESTDATA
// is set (as CI sets).
//
//	j := jaegertest.Start(t)
//	// send spans to j.OTLP (http://127.0.0.1:<port>, path /v1/traces)
//	spans, err := j.Trace(ctx, "4bf92f3577b34da6a3ce929d0e0e4736")
package jaegertest
