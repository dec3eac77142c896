package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tandem-serve/tandem/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
)

// otlpFlagUsage is the help of --otlp-traces-endpoint, on serve, proxy and
// up.
const otlpFlagUsage = "OpenTelemetry traces: the OTLP/HTTP collector URL, e.g. http://localhost:4318 (path /v1/traces unless given; default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; off when neither is set). Sampling follows $OTEL_TRACES_SAMPLER and $OTEL_TRACES_SAMPLER_ARG, the service name $OTEL_SERVICE_NAME; see docs/usage/observability.md"

// registerOTLPFlag registers --otlp-traces-endpoint on fs.
func registerOTLPFlag(fs *flag.FlagSet, endpoint *string) {
	fs.StringVar(endpoint, "otlp-traces-endpoint", "", otlpFlagUsage)
}

// startTracing turns tracing on when endpoint or the OTEL_* environment
// says so, for the process's service, and returns what flushes and stops
// it at exit.
func startTracing(endpoint, service string, attrs ...attribute.KeyValue) (stop func(), err error) {
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: endpoint, ServiceName: service, Attributes: attrs})
	if err != nil {
		return nil, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "flushing traces: %v (is the collector at --otlp-traces-endpoint up?)\n", err)
		}
	}, nil
}
