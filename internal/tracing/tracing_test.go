package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// clearEnv unsets the variables that turn tracing on or off.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
}

func TestOffCostsNothing(t *testing.T) {
	clearEnv(t)
	shutdown, err := Setup(context.Background(), Config{ServiceName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	if On() {
		t.Fatal("tracing is on with no endpoint configured")
	}
	ctx := context.Background()
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	allocs := testing.AllocsPerRun(100, func() {
		c, s := Start(ctx, SpanProxyRequest, trace.SpanKindServer)
		if c != ctx || s.IsRecording() {
			t.Fatal("Start while off changed the context or recorded")
		}
		Inject(c, h)
		_ = Extract(c, h)
		Record(c, SpanEngineQueue, time.Time{}, time.Time{})
		s.End()
	})
	if allocs != 0 {
		t.Errorf("tracing off allocates %v times per request", allocs)
	}
	if got := h.Get("Traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("Inject while off changed the client's traceparent to %q", got)
	}
}

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		cfg  Config
		want bool
	}{
		{"nothing set", nil, Config{}, false},
		{"the flag", nil, Config{Endpoint: "http://c:4318"}, true},
		{"the traces variable", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, Config{}, true},
		{"the general variable", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, Config{}, true},
		{"the SDK disabled", map[string]string{"OTEL_SDK_DISABLED": "true"}, Config{Endpoint: "http://c:4318"}, false},
		{"the exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none"}, Config{Endpoint: "http://c:4318"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			if got := Enabled(c.cfg); got != c.want {
				t.Errorf("Enabled = %v, want %v", got, c.want)
			}
		})
	}
}

func TestEndpointURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://localhost:4318":         "http://localhost:4318/v1/traces",
		"http://localhost:4318/":        "http://localhost:4318/v1/traces",
		"https://c.example/otlp/traces": "https://c.example/otlp/traces",
		"localhost:4318":                "",
		"grpc://localhost:4317":         "",
		"http://":                       "",
	} {
		got, err := endpointURL(in)
		if want == "" {
			if err == nil {
				t.Errorf("endpointURL(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("endpointURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
