package openai

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// runTrace collects, while tracing is on, what a completion or chat
// request's spans say: the engine's timing at the first token (from the
// timestamps the engine keeps anyway) and the final events' usage and KV
// hold. The spans are emitted when the request ends (endTrace), so the
// step loop does no tracing work.
type runTrace struct {
	received time.Time
	span     trace.Span

	mu       sync.Mutex
	kv       *kvparams.Params // the request's kv_transfer_params
	n        int
	maxToks  int
	timing   *engine.Timing // choice 0's, at its first token
	firstAt  time.Time
	usage    engine.Usage // summed over choices
	held     []byte       // a prefill's final kv_transfer_params
	finished time.Time
}

type runTraceKey struct{}

// startTrace starts the request's server span, the child of the leg's
// traceparent, and returns r carrying it and the collector its run fills.
// It returns r and nil while tracing is off.
func startTrace(r *http.Request) (*http.Request, *runTrace) {
	if !tracing.On() {
		return r, nil
	}
	rt := &runTrace{received: time.Now()}
	ctx, span := tracing.Start(tracing.Extract(r.Context(), r.Header), tracing.SpanEngineRequest, trace.SpanKindServer)
	rt.span = span
	if id := r.Header.Get("X-Request-Id"); id != "" && apierror.CheckRequestID(id) == nil {
		span.SetAttributes(tracing.AttrRequestID.String(id))
	}
	ctx = context.WithValue(ctx, runTraceKey{}, rt)
	return r.WithContext(ctx), rt
}

// traceOf is the collector startTrace put in ctx; nil when tracing is off.
func traceOf(ctx context.Context) *runTrace {
	rt, _ := ctx.Value(runTraceKey{}).(*runTrace)
	return rt
}

// started notes the job the request runs.
func (rt *runTrace) started(j *job) {
	if rt == nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.kv, rt.n = j.kv, j.choices()
	if len(j.params) > 0 {
		rt.maxToks = j.params[0].MaxTokens
	}
}

// observe notes one event of choice k, as it arrives.
func (rt *runTrace) observe(k int, ev *engine.Event) {
	if rt == nil || (ev.Timing == nil && ev.Finish == "") {
		return
	}
	now := time.Now()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if ev.Timing != nil && k == 0 {
		rt.timing, rt.firstAt = ev.Timing, now
	}
	if ev.Finish != "" {
		rt.usage.PromptTokens += ev.Usage.PromptTokens
		rt.usage.CompletionTokens += ev.Usage.CompletionTokens
		rt.usage.CachedTokens += ev.Usage.CachedTokens
		if ev.KVTransfer != nil {
			rt.held = ev.KVTransfer
		}
		rt.finished = now
	}
}

// end emits the request's phases as child spans and ends its span: the
// queue, on a decode the KV pull and the wait after it, the prefill compute
// up to the first token, and the decode after it, placed back from the
// first token by the engine's Timing.
func (rt *runTrace) end(s *Server, path string, status int) {
	if rt == nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	end := time.Now()
	span := rt.span
	ctx := trace.ContextWithSpan(context.Background(), span)
	span.SetAttributes(tracing.AttrHTTPRoute.String(path), tracing.AttrOperationName.String(operationName(path)),
		tracing.AttrRequestModel.String(s.cfg.ModelName), tracing.AttrResponseModel.String(s.cfg.ModelName),
		tracing.AttrHTTPStatus.Int(status), tracing.AttrRole.String(rt.role()),
		tracing.AttrE2E.Float64(end.Sub(rt.received).Seconds()))
	if rt.n > 0 {
		span.SetAttributes(tracing.AttrRequestN.Int(rt.n), tracing.AttrRequestMaxToks.Int(rt.maxToks),
			tracing.AttrInputTokens.Int(rt.usage.PromptTokens), tracing.AttrOutputTokens.Int(rt.usage.CompletionTokens))
	}
	if t := rt.timing; t != nil {
		prefillAt := rt.firstAt.Add(-t.Prefill)
		readyAt := prefillAt.Add(-t.KVReady)
		loadAt := readyAt.Add(-t.KVLoad)
		queueAt := loadAt.Add(-t.Queue)
		tracing.Record(ctx, tracing.SpanEngineQueue, queueAt, loadAt)
		if t.KVLoad > 0 {
			tracing.Record(ctx, tracing.SpanEngineKVPull, loadAt, readyAt, rt.kvAttrs()...)
			tracing.Record(ctx, tracing.SpanEngineKVReady, readyAt, prefillAt)
		}
		tracing.Record(ctx, tracing.SpanEnginePrefill, prefillAt, rt.firstAt)
		if !rt.finished.IsZero() {
			tracing.Record(ctx, tracing.SpanEngineDecode, rt.firstAt, rt.finished)
		}
		span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(rt.firstAt))
		span.SetAttributes(tracing.AttrTimeInQueue.Float64(t.Queue.Seconds()),
			tracing.AttrTimeToFirstTok.Float64(rt.firstAt.Sub(rt.received).Seconds()),
			tracing.AttrTimeInPrefill.Float64(t.Prefill.Seconds()))
		if !rt.finished.IsZero() {
			span.SetAttributes(tracing.AttrTimeInDecode.Float64(rt.finished.Sub(rt.firstAt).Seconds()))
		}
	}
	if rt.held != nil {
		attrs := []attribute.KeyValue{}
		if kv, err := parseKVTransfer(rt.held); err == nil && kv != nil {
			attrs = append(attrs, tracing.AttrKVBlocks.Int(blocks(kv)), tracing.AttrKVRemoteEngine.String(kv.RemoteEngineID))
		}
		span.AddEvent(tracing.EventKVHeld, trace.WithTimestamp(rt.finished), trace.WithAttributes(attrs...))
	}
	if status >= 400 {
		tracing.Fail(span, http.StatusText(status), nil)
	}
	span.End(trace.WithTimestamp(end))
}

// role is the request's part in P/D: "prefill" (it holds its KV for a
// remote decode), "decode" (it pulls its prompt's KV) or "both".
func (rt *runTrace) role() string {
	switch {
	case rt.kv != nil && rt.kv.DoRemoteDecode:
		return "prefill"
	case rt.kv != nil && rt.kv.DoRemotePrefill:
		return "decode"
	}
	return "both"
}

// kvAttrs describes a decode's KV pull: the engine it pulled from, the
// blocks and tokens, and the transfer mode.
func (rt *runTrace) kvAttrs() []attribute.KeyValue {
	kv := rt.kv
	if kv == nil {
		return nil
	}
	return []attribute.KeyValue{
		tracing.AttrKVRemoteEngine.String(kv.RemoteEngineID), tracing.AttrKVRemoteHost.String(kv.RemoteHost),
		tracing.AttrKVBlocks.Int(blocks(kv)), tracing.AttrKVPulledTokens.Int(kv.RemoteNumTokens),
		tracing.AttrKVTransport.String(kv.TransferMode),
	}
}

// blocks counts the KV blocks params name (over every KV-cache group).
func blocks(kv *kvparams.Params) int {
	n := 0
	for _, g := range kv.RemoteBlockIDs {
		n += len(g)
	}
	return n
}

// operationName is gen_ai.operation.name for a generation path.
func operationName(path string) string {
	if path == "/v1/chat/completions" {
		return "chat"
	}
	return "text_completion"
}

// statusRecorder notes the status a handler writes, for the span.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
