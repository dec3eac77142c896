package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names Tandem's tracer.
const instrumentationName = "github.com/tandem-serve/tandem"

// Config configures Setup.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's traces URL (the
	// --otlp-traces-endpoint flag): "http://host:4318" takes the standard
	// path /v1/traces, a URL with a path is used as it is. Empty: the
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or OTEL_EXPORTER_OTLP_ENDPOINT)
	// environment variable, and when neither is set tracing stays off.
	Endpoint string
	// ServiceName is the resource's service.name when OTEL_SERVICE_NAME
	// does not set it ("tandem-proxy", "tandem-engine").
	ServiceName string
	// Attributes are added to the resource (the engine's role, ...).
	Attributes []attribute.KeyValue
}

// tracer is the installed tracer; nil while tracing is off.
var tracer atomic.Pointer[trace.Tracer]

// propagator reads and writes W3C traceparent and tracestate headers.
var propagator = propagation.TraceContext{}

// noSpan is what Start returns while tracing is off: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// Enabled reports whether cfg, with the environment, turns tracing on: an
// endpoint is configured and OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER do
// not turn it off.
func Enabled(cfg Config) bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return cfg.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Setup installs the process's tracer when cfg (with the environment)
// turns tracing on, and returns the function that flushes the spans still
// queued and uninstalls it, for the process's shutdown. Sampling follows
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: sample every
// request the client did not mark unsampled, parentbased_always_on), the
// exporter the other OTEL_EXPORTER_OTLP_* variables (headers, timeout,
// compression). When tracing is off it installs nothing and the returned
// function does nothing.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if !Enabled(cfg) {
		return func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := endpointURL(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("starting the OTLP trace exporter: %w (check --otlp-traces-endpoint and the OTEL_EXPORTER_OTLP_* variables)", err)
	}
	attrs := append([]attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}, cfg.Attributes...)
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("describing the trace resource: %w (check OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME)", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t := tp.Tracer(instrumentationName)
	tracer.Store(&t)
	return func(ctx context.Context) error {
		tracer.CompareAndSwap(&t, nil)
		return tp.Shutdown(ctx)
	}, nil
}

// endpointURL is the --otlp-traces-endpoint value as the exporter's URL:
// the standard path when it names none.
func endpointURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("--otlp-traces-endpoint %q: want an OTLP/HTTP URL such as http://localhost:4318", s)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// On reports whether tracing is on in this process.
func On() bool { return tracer.Load() != nil }

// Start starts a span of kind under ctx's span. While tracing is off it
// returns ctx and a span that records nothing, allocating nothing.
func Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, noSpan
	}
	return (*t).Start(ctx, name, trace.WithSpanKind(kind))
}

// Record emits, under ctx's span, a finished internal span from start to
// end with attrs: the engine's phases, recorded after the fact. It does
// nothing while tracing is off or when the phase is empty.
func Record(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	t := tracer.Load()
	if t == nil || !end.After(start) {
		return
	}
	_, s := (*t).Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(end))
}

// StartAt starts a span of kind at start under ctx's span, for a server
// span whose phases are recorded after the fact; nil-safe like Start.
func StartAt(ctx context.Context, name string, kind trace.SpanKind, start time.Time) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, noSpan
	}
	return (*t).Start(ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(start))
}

// Inject writes ctx's span into h as traceparent (and tracestate), for a
// request to the next process. While tracing is off it leaves h alone: a
// client's own traceparent, copied with its other headers, passes through.
func Inject(ctx context.Context, h http.Header) {
	if tracer.Load() == nil {
		return
	}
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// Extract returns ctx with the remote span a request's traceparent names
// as its parent. While tracing is off it returns ctx.
func Extract(ctx context.Context, h http.Header) context.Context {
	if tracer.Load() == nil {
		return ctx
	}
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Fail marks s failed with reason (an error.type value) and, when err is
// set, records it.
func Fail(s trace.Span, reason string, err error) {
	if !s.IsRecording() {
		return
	}
	s.SetAttributes(AttrErrorType.String(reason))
	if err != nil {
		s.RecordError(err)
	}
	s.SetStatus(codes.Error, reason)
}

// NoSpan returns a span that records nothing: what Start returns while
// tracing is off.
func NoSpan() trace.Span { return noSpan }
