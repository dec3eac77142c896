package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/testutil"
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

// TestTracesAcrossProxyAndEngines runs the trace scenario (traceScenario)
// tracing to an OTLP/HTTP receiver written here and checks its span trees.
// TestTracesInJaeger runs the same against a real Jaeger.
func TestTracesAcrossProxyAndEngines(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	sc := runTraceScenario(t, collector.URL, recv.traceOf)
	checkTraceScenario(t, sc, recv.traceOf)
}

// traceScenario names the traces runTraceScenario made: a P/D request, a
// fallback, requests of which one at least retried its prefill leg, and a
// conversation's two turns (the second reads the first's KV back from the
// decode).
type traceScenario struct {
	remote, fallback string
	retries          []string
	turn1, turn2     string
}

// The client's span, parent of every trace's root.
const clientSpan = "00f067aa0ba902b7"

// runTraceScenario turns tracing on to the OTLP/HTTP collector at endpoint,
// sends the scenario's requests through real proxies and simulated prefill
// and decode engines, each with the client's traceparent, and returns once
// traceOf (the collector's) shows every trace's proxy and engine spans.
// An engine ends its span after its answer's last byte, so a client can
// have the whole answer before the span is over: the spans are exported
// every 20 ms and waited for, then flushed.
func runTraceScenario(t *testing.T, endpoint string, traceOf func(id string) []*tracepb.Span) traceScenario {
	t.Helper()
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: endpoint, ServiceName: "tandem-test"})
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
				t.Fatalf("flushing spans to the collector: %v", err)
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
	// Conversation mode: engines that keep a turn's KV for the next, and
	// pull a history of any length.
	bidir := []string{"--kv-bidirectional", "--kv-recompute-threshold", "1"}
	// Two prefills in turn (round robin), so turn 2's has no copy of turn
	// 1's prompt in its own prefix cache and must read the history back.
	cpre0, _ := startSimEngine(t, append([]string{"--role", "prefill", "--kv-port", "0"}, bidir...)...)
	cpre1, _ := startSimEngine(t, append([]string{"--role", "prefill", "--kv-port", "0"}, bidir...)...)
	cdec, _ := startSimEngine(t, append([]string{"--role", "decode", "--kv-port", "0"}, bidir...)...)
	_, conv := startTestProxy(t, proxy.Config{Prefill: []string{cpre0, cpre1}, Decode: []string{cdec}, Conversations: true, Policy: factory.PolicyRoundRobin, PDDecider: "always"})
	waitHealthy(t, pd)
	waitHealthy(t, fb)
	waitHealthy(t, rt)
	waitHealthy(t, conv)

	sc := traceScenario{
		remote:   "4bf92f3577b34da6a3ce929d0e0e4736",
		fallback: "5bf92f3577b34da6a3ce929d0e0e4737",
		// Round robin: of two requests, one at least reaches the broken
		// prefill first.
		retries: []string{"6bf92f3577b34da6a3ce929d0e0e4738", "7bf92f3577b34da6a3ce929d0e0e4739"},
		turn1:   "8bf92f3577b34da6a3ce929d0e0e473a",
		turn2:   "9bf92f3577b34da6a3ce929d0e0e473b",
	}
	send := func(url, trace, body, want string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+trace+"-"+clientSpan+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get(proxy.HeaderPD), want) {
			t.Fatalf("answer %s, %s %q; want 200, %s", resp.Status, proxy.HeaderPD, resp.Header.Get(proxy.HeaderPD), want)
		}
		return string(raw)
	}
	const story = "Once upon a time, there was a little girl named Lily."
	streamed := `{"model":"hf","prompt":"` + story + `","max_tokens":8,"stream":true}`
	send(pd, sc.remote, streamed, "remote")
	send(fb, sc.fallback, streamed, "fallback")
	for _, id := range sc.retries {
		send(rt, id, streamed, "remote")
	}
	// Turn 1 answers one token, so the decode holds the KV of its prompt
	// alone (a turn's KV but its last sampled token), which turn 2's prompt
	// starts with: the simulated model's answers are random text that
	// would not tokenize back to the same ids.
	send(conv, sc.turn1, fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":1,"temperature":0,"conversation_id":"c1"}`, story), "remote")
	send(conv, sc.turn2, fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":8,"temperature":0,"conversation_id":"c1"}`, story+" She went to the park."), "remote")

	// The engine spans each trace holds: a prefill's and a decode's, or
	// the decode's alone for the fallback.
	engines := map[string]int{sc.remote: 2, sc.fallback: 1, sc.retries[0]: 2, sc.retries[1]: 2, sc.turn1: 2, sc.turn2: 2}
	testutil.WaitFor(t, "every request's proxy and engine spans at the collector", 30*time.Second, func() bool {
		for id, want := range engines {
			proxies, got := 0, 0
			for _, s := range traceOf(id) {
				switch s.Name {
				case tracing.SpanProxyRequest:
					proxies++
				case tracing.SpanEngineRequest:
					got++
				}
			}
			if proxies < 1 || got < want {
				return false
			}
		}
		return true
	})
	flush()
	return sc
}

// checkTraceScenario checks the span tree of each of sc's traces, read
// with traceOf (by hex trace id): one trace per request, the client's
// traceparent as the root's parent, each engine's span under the leg that
// sent it, retries and fallbacks as spans with their reasons, and a
// conversation's turn 2 prefill pulling its history from the decode.
func checkTraceScenario(t *testing.T, sc traceScenario, traceOf func(id string) []*tracepb.Span) {
	t.Run("P/D", func(t *testing.T) {
		st := newSpanTree(t, traceOf(sc.remote))
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
		for _, id := range sc.retries {
			st := newSpanTree(t, traceOf(id))
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
		st := newSpanTree(t, traceOf(sc.fallback))
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

	t.Run("multi-turn read-back", func(t *testing.T) {
		// Turn 1: an ordinary P/D request; its prefill computes the whole
		// prompt, and its decode pulls it.
		st1 := newSpanTree(t, traceOf(sc.turn1))
		pe1 := st1.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "prefill")
		st1.noChildNamed(pe1, tracing.SpanEngineKVPull)
		de1 := st1.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "decode")
		prefill0 := attr(st1.childNamed(de1, tracing.SpanEngineKVPull), string(tracing.AttrKVRemoteEngine))

		// Turn 2, on the other prefill: it reads the history back from
		// the decode that held it (a pull under the prefill's span, from
		// neither prefill), then the decode pulls the prompt from it.
		st := newSpanTree(t, traceOf(sc.turn2))
		root := st.one(tracing.SpanProxyRequest, "", "")
		if hexID(root.ParentSpanId) != clientSpan {
			t.Errorf("the proxy's span's parent is %s, want the client's %s", hexID(root.ParentSpanId), clientSpan)
		}
		if got := attr(st.one(tracing.SpanProxyRoute, "", ""), string(tracing.AttrPDReason)); got != "conversation" {
			t.Errorf("turn 2's route reason %q, want conversation", got)
		}
		pleg := st.one(tracing.SpanProxyPrefillLeg, "", "")
		st.parentIs(pleg, root)
		pe := st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "prefill")
		st.parentIs(pe, pleg)
		readBack := st.childNamed(pe, tracing.SpanEngineKVPull)
		if attr(readBack, string(tracing.AttrKVBlocks)) == "" || attr(readBack, string(tracing.AttrKVPulledTokens)) == "" {
			t.Errorf("the history's pull names no blocks or tokens: %v", readBack.Attributes)
		}
		st.childNamed(pe, tracing.SpanEnginePrefill)
		dleg := st.one(tracing.SpanProxyDecodeLeg, "", "")
		st.parentIs(dleg, root)
		de := st.one(tracing.SpanEngineRequest, string(tracing.AttrRole), "decode")
		st.parentIs(de, dleg)
		prefill1 := attr(st.childNamed(de, tracing.SpanEngineKVPull), string(tracing.AttrKVRemoteEngine))
		from := attr(readBack, string(tracing.AttrKVRemoteEngine))
		if from == "" || from == prefill0 || from == prefill1 || prefill0 == prefill1 {
			t.Errorf("turn 2's prefill read back from %q; want the decode, not prefill %q (turn 1) or %q (turn 2)", from, prefill0, prefill1)
		}
	})
}

// noChildNamed checks that parent has no child span named name.
func (st *spanTree) noChildNamed(parent *tracepb.Span, name string) {
	st.t.Helper()
	for _, s := range st.spans {
		if s.Name == name && hexID(s.ParentSpanId) == hexID(parent.SpanId) {
			st.t.Errorf("span %s (%s) has a child %s: %v", parent.Name, attr(parent, "tandem.role"), name, s.Attributes)
		}
	}
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
