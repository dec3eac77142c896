package main

import (
	"context"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/tandem-serve/tandem/internal/jaegertest"
	"github.com/tandem-serve/tandem/internal/testutil"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// TestTracesInJaeger runs the trace scenario (traceScenario: a P/D
// request, a fallback, a retry and a conversation's read-back) tracing to
// a real Jaeger over OTLP/HTTP, and checks the span trees it reads back
// through Jaeger's query API (GET /api/traces/{id}). The binary comes from
// bash scripts/jaeger-binary.sh (or $TANDEM_JAEGER); without it the test
// skips, and fails under TANDEM_REQUIRE_TESTDATA.
func TestTracesInJaeger(t *testing.T) {
	if _, err := jaegertest.Binary(); err != nil {
		testutil.Missing(t, err.Error())
	}
	j := jaegertest.Start(t)
	traceOf := func(id string) []*tracepb.Span {
		spans, err := j.Trace(context.Background(), id)
		if errors.Is(err, jaegertest.ErrNoTrace) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		out := make([]*tracepb.Span, len(spans))
		for i := range spans {
			out[i] = fromJaeger(t, &spans[i])
		}
		return out
	}
	sc := runTraceScenario(t, j.OTLP, traceOf)
	checkTraceScenario(t, sc, traceOf)
}

// fromJaeger is a span Jaeger returned as the OTLP span the checks read:
// ids, name, parent, tags as string attributes, logs as events, and the
// error status Jaeger keeps as the otel.status_code tag.
func fromJaeger(t *testing.T, s *jaegertest.Span) *tracepb.Span {
	t.Helper()
	id := func(h string) []byte {
		if h == "" {
			return nil
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("Jaeger returned a span id %q that is not hex: %v", h, err)
		}
		return b
	}
	out := &tracepb.Span{
		TraceId:      id(s.TraceID),
		SpanId:       id(s.SpanID),
		ParentSpanId: id(s.ParentID()),
		Name:         s.OperationName,
		Status:       &tracepb.Status{},
	}
	for _, kv := range s.Tags {
		out.Attributes = append(out.Attributes, &commonpb.KeyValue{Key: kv.Key,
			Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s.Tag(kv.Key)}}})
	}
	for _, name := range s.Events() {
		out.Events = append(out.Events, &tracepb.Span_Event{Name: name})
	}
	if s.Tag("otel.status_code") == "ERROR" {
		out.Status.Code = tracepb.Status_STATUS_CODE_ERROR
	}
	return out
}
