package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/tracing"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver (protobuf encoding, the
// exporter's default) that keeps what it is sent: the collector end of the
// tracing test.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces, application/x-protobuf", http.StatusBadRequest)
		return
	}
	data, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// traceOf returns the spans of trace id (hex).
func (o *otlpReceiver) traceOf(id string) []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range o.spans {
		if hexID(s.TraceId) == id {
			out = append(out, s)
		}
	}
	return out
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// attr is span s's attribute key as a string ("" when absent).
func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10)
			}
		}
	}
	return ""
}

// spanTree indexes a trace's spans by id, and finds them by name and by
// an attribute.
type spanTree struct {
	t     *testing.T
	spans []*tracepb.Span
	byID  map[string]*tracepb.Span
}

func newSpanTree(t *testing.T, spans []*tracepb.Span) *spanTree {
	st := &spanTree{t: t, spans: spans, byID: map[string]*tracepb.Span{}}
	for _, s := range spans {
		st.byID[hexID(s.SpanId)] = s
	}
	return st
}

// one returns the single span named name whose attribute key is value
// (any, with key ""), failing the test otherwise.
func (st *spanTree) one(name, key, value string) *tracepb.Span {
	st.t.Helper()
	var found []*tracepb.Span
	for _, s := range st.spans {
		if s.Name == name && (key == "" || attr(s, key) == value) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range st.spans {
			names = append(names, s.Name+"("+attr(s, "tandem.role")+")")
		}
		st.t.Fatalf("want one span %s with %s=%q, found %d among %v", name, key, value, len(found), names)
	}
	return found[0]
}

// parentIs checks that child's parent is parent.
func (st *spanTree) parentIs(child, parent *tracepb.Span) {
	st.t.Helper()
	if hexID(child.ParentSpanId) != hexID(parent.SpanId) {
		p := st.byID[hexID(child.ParentSpanId)]
		name := "<none in trace>"
		if p != nil {
			name = p.Name
		}
		st.t.Errorf("span %s's parent is %s, want %s", child.Name, name, parent.Name)
	}
}

// TestTracesAcrossProxyAndEngines sends a P/D request, a retry and a fallback
// through a real proxy and simulated prefill and decode engines, tracing to
// an OTLP/HTTP receiver, and checks the span tree of each: one trace id,
// the client's traceparent as the root's parent, and each engine's span
// under the leg that sent it.
func TestTracesAcrossProxyAndEngines(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: collector.URL, ServiceName: "tandem-test"})
	if err != nil {
		t.Fatal(err)
	}
	flushed := false
	flush := func() {
		if !flushed {
			flushed = true
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Fatalf("flushing spans to the receiver: %v", err)
			}
		}
	}
	defer flush()

	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	dec, _ := startSimEngine(t, "--role", "decode")
	_, pd := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
	// A prefill whose every leg fails with 500: the request falls back.
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		http.Error(w, `{"error":{"message":"broken","type":"server_error"}}`, http.StatusInternalServerError)
	}))
	defer broken.Close()
	_, fb := startTestProxy(t, proxy.Config{Prefill: []string{broken.URL}, Decode: []string{dec}, PrefillRetries: -1})
	// Two prefills, one broken: a leg that reaches it is retried on the
	// other.
	_, rt := startTestProxy(t, proxy.Config{Prefill: []string{broken.URL, pre}, Decode: []string{dec}, PrefillRetries: 1})
	waitHealthy(t, pd)
	waitHealthy(t, fb)
	waitHealthy(t, rt)

	const (
		remoteTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
		fallbackTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
		clientSpan    = "00f067aa0ba902b7"
	)
	send := func(url, trace, want string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"model":"hf","prompt":"Once upon a time, there was a little girl named Lily.","max_tokens":8,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+trace+"-"+clientSpan+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get(proxy.HeaderPD), want) {
			t.Fatalf("answer %s, %s %q; want 200, %s", resp.Status, proxy.HeaderPD, resp.Header.Get(proxy.HeaderPD), want)
		}
	}
	send(pd, remoteTrace, "remote")
	send(fb, fallbackTrace, "fallback")
	// Round robin: of two requests, one at least reaches the broken
	// prefill first.
	retryTraces := []string{"6bf92f3577b34da6a3ce929d0e0e4738", "7bf92f3577b34da6a3ce929d0e0e4739"}
	for _, id := range retryTraces {
		send(rt, id, "remote")
	}
	flush()

	t.Run("P/D", func(t *testing.T) {
		st := newSpanTree(t, recv.traceOf(remoteTrace))
		root := st.one(tracing.SpanProxyRequest, "", "")
		if hexID(root.ParentSpanId) != clientSpan {
			t.Errorf("the proxy's span's parent is %s, want the client's %s", hexID(root.ParentSpanId), clientSpan)
		}
		if got := attr(root, string(tracing.AttrOutcome)); got != "remote" {
			t.Errorf("outcome %q", got)
		}
		if got := attr(root, string(tracing.AttrRequestModel)); got != "hf" {
			t.Errorf("gen_ai.request.model %q", got)
		}
		route := st.one(tracing.SpanProxyRoute, "", "")
		st.parentIs(route, root)
		if got := attr(route, string(tracing.AttrPDDecision)); got != "remote" {
			t.Errorf("route decision %q", got)
		}
		pleg := st.one(tracing.SpanProxyPrefillLeg, "", "")
		dleg := st.one(tracing.SpanProxyDecodeLeg, "", "")
		st.parentIs(pleg, root)
		st.parentIs(dleg, root)
		pe := st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "prefill")
		de := st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "decode")
		st.parentIs(pe, pleg)
		st.parentIs(de, dleg)
		if !hasEvent(pe, tracing.EventKVHeld) {
			t.Errorf("the prefill's span has no %s event", tracing.EventKVHeld)
		}
		if !hasEvent(de, tracing.EventFirstToken) {
			t.Errorf("the decode's span has no %s event", tracing.EventFirstToken)
		}
		for _, name := range []string{tracing.SpanEngineQueue, tracing.SpanEnginePrefill} {
			st.childNamed(pe, name)
			st.childNamed(de, name)
		}
		pull := st.childNamed(de, tracing.SpanEngineKVPull)
		if attr(pull, string(tracing.AttrKVBlocks)) == "" || attr(pull, string(tracing.AttrKVRemoteEngine)) == "" {
			t.Errorf("the KV pull's span names no blocks or engine: %v", pull.Attributes)
		}
		st.childNamed(de, tracing.SpanEngineDecode)
	})

	t.Run("retry", func(t *testing.T) {
		retried := 0
		for _, id := range retryTraces {
			st := newSpanTree(t, recv.traceOf(id))
			root := st.one(tracing.SpanProxyRequest, "", "")
			first := st.one(tracing.SpanProxyPrefillLeg, string(tracing.AttrAttempt), "0")
			st.parentIs(first, root)
			if attr(first, string(tracing.AttrFailureReason)) == "" {
				continue // the first attempt reached the working prefill
			}
			retried++
			if got := attr(first, string(tracing.AttrFailureReason)); got != "prefill_5xx" {
				t.Errorf("the failed attempt's reason is %q, want prefill_5xx", got)
			}
			second := st.one(tracing.SpanProxyPrefillLeg, string(tracing.AttrAttempt), "1")
			st.parentIs(second, root)
			st.parentIs(st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "prefill"), second)
			st.parentIs(st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "decode"), st.one(tracing.SpanProxyDecodeLeg, "", ""))
		}
		if retried == 0 {
			t.Error("neither request retried its prefill leg")
		}
	})

	t.Run("fallback", func(t *testing.T) {
		st := newSpanTree(t, recv.traceOf(fallbackTrace))
		root := st.one(tracing.SpanProxyRequest, "", "")
		if got := attr(root, string(tracing.AttrOutcome)); got != "fallback" {
			t.Errorf("outcome %q", got)
		}
		pleg := st.one(tracing.SpanProxyPrefillLeg, "", "")
		st.parentIs(pleg, root)
		if got := attr(pleg, string(tracing.AttrFailureReason)); got != "prefill_5xx" {
			t.Errorf("the failed prefill leg's reason is %q, want prefill_5xx", got)
		}
		if pleg.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("the failed prefill leg's status is %v", pleg.Status)
		}
		fall := st.one(tracing.SpanProxyFallback, string(tracing.AttrFallbackReason), "prefill_5xx")
		st.parentIs(fall, root)
		dleg := st.one(tracing.SpanProxyDecodeLeg, "", "")
		st.parentIs(dleg, fall)
		de := st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "both")
		st.parentIs(de, dleg)
	})
}

// childNamed returns parent's one child span named name.
func (st *spanTree) childNamed(parent *tracepb.Span, name string) *tracepb.Span {
	st.t.Helper()
	var found []*tracepb.Span
	for _, s := range st.spans {
		if s.Name == name && hexID(s.ParentSpanId) == hexID(parent.SpanId) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		st.t.Fatalf("want one span %s under %s (%s), found %d", name, parent.Name, attr(parent, "tandem.role"), len(found))
	}
	return found[0]
}

func hasEvent(s *tracepb.Span, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}
