package proxy

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// The proxy's spans (package tracing names them): the request's server
// span, the route decision, each leg attempt and a fallback. While tracing
// is off each helper returns its request unchanged and a span that records
// nothing, so the request path allocates nothing for them.

// traceRequest starts the request's server span, the child of the client's
// traceparent if it sent one, and returns r carrying it.
func traceRequest(r *http.Request) (*http.Request, trace.Span) {
	if !tracing.On() {
		return r, tracing.NoSpan()
	}
	ctx, span := tracing.Start(tracing.Extract(r.Context(), r.Header), tracing.SpanProxyRequest, trace.SpanKindServer)
	span.SetAttributes(tracing.AttrHTTPRoute.String(r.URL.Path), tracing.AttrOperationName.String(operation(r.URL.Path)))
	return r.WithContext(ctx), span
}

// endRequest ends the request's span with its outcome and X-Tandem-Pd.
func endRequest(span trace.Span, h http.Header, id, outcome string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.AttrRequestID.String(id), tracing.AttrOutcome.String(outcome))
	if pd := h.Get(HeaderPD); pd != "" {
		span.SetAttributes(tracing.AttrPDPath.String(pd))
	}
	switch outcome {
	case outcomeRemote, outcomeFallback, outcomeLocal:
	default:
		tracing.Fail(span, outcome, nil)
	}
	span.End()
}

// operation is gen_ai.operation.name for a path.
func operation(path string) string {
	if strings.HasSuffix(path, "/chat/completions") {
		return "chat"
	}
	return "text_completion"
}

// noteRequest puts the request's GenAI attributes on its span.
func noteRequest(r *http.Request, obj *object, preq *router.Request) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	var model string
	_ = json.Unmarshal(obj.getFolded("model"), &model)
	span.SetAttributes(tracing.AttrRequestModel.String(model), tracing.AttrRequestMaxToks.Int(preq.MaxTokens),
		tracing.AttrInputTokens.Int(preq.PromptTokens))
}

// startRoute starts the route decision's span.
func startRoute(r *http.Request) trace.Span {
	_, span := tracing.Start(r.Context(), tracing.SpanProxyRoute, trace.SpanKindInternal)
	return span
}

// endRoute ends the route decision's span: the decode picked (nil: none,
// outcome says why) and whether the prompt is prefilled remotely.
func (p *Proxy) endRoute(span trace.Span, d *backend, decision router.Decision, outcome string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.AttrPolicy.String(p.cfg.Policy))
	if d == nil {
		tracing.Fail(span, outcome, nil)
		span.End()
		return
	}
	kind := "local"
	if decision.Remote {
		kind = "remote"
	}
	span.SetAttributes(tracing.AttrDecodeBackend.String(d.base), tracing.AttrPDDecision.String(kind), tracing.AttrPDReason.String(decision.Reason))
	span.End()
}

// startLeg starts the span of one leg attempt to b and returns r carrying
// it, so that the leg's request (built on r's context) injects it as
// traceparent.
func startLeg(r *http.Request, name string, b *backend, attempt int) (*http.Request, trace.Span) {
	if !tracing.On() {
		return r, tracing.NoSpan()
	}
	ctx, span := tracing.Start(r.Context(), name, trace.SpanKindClient)
	span.SetAttributes(tracing.AttrServerAddress.String(b.base), tracing.AttrAttempt.Int(attempt))
	return r.WithContext(ctx), span
}

// endPrefillLeg ends a prefill attempt's span with how it ended.
func endPrefillLeg(span trace.Span, res prefillResult) {
	if !span.IsRecording() {
		return
	}
	switch {
	case res.status != 0:
		span.SetAttributes(tracing.AttrHTTPStatus.Int(res.status))
	case res.reject != nil:
		span.SetAttributes(tracing.AttrHTTPStatus.Int(res.reject.status))
	}
	if res.reason != "" {
		span.SetAttributes(tracing.AttrFailureReason.String(res.reason))
		tracing.Fail(span, res.reason, nil)
	}
	span.End()
}

// noteDecodeFirstByte records a decode attempt's answer status and first
// byte on its span.
func noteDecodeFirstByte(a *decodeAttempt) {
	if !a.span.IsRecording() {
		return
	}
	if a.resp != nil {
		a.span.SetAttributes(tracing.AttrHTTPStatus.Int(a.resp.StatusCode))
	}
	if a.n > 0 {
		a.span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(a.firstAt))
	}
}

// noteDecodeFailure marks a decode attempt failed with label (it is retried
// or the request fails).
func noteDecodeFailure(a *decodeAttempt, label string) {
	if !a.span.IsRecording() {
		return
	}
	a.span.SetAttributes(tracing.AttrFailureReason.String(label))
	tracing.Fail(a.span, label, a.failErr())
}

// startFallback starts the span of a decode leg run alone after the prefill
// leg failed for reason, and returns r carrying it.
func startFallback(r *http.Request, reason string) (*http.Request, trace.Span) {
	if !tracing.On() {
		return r, tracing.NoSpan()
	}
	ctx, span := tracing.Start(r.Context(), tracing.SpanProxyFallback, trace.SpanKindInternal)
	span.SetAttributes(tracing.AttrFallbackReason.String(reason))
	return r.WithContext(ctx), span
}
