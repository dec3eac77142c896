package jaegertest

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestSpansGoInAndComeBack sends two spans (a parent and a child with an
// attribute and an event) to Jaeger's OTLP/HTTP receiver as JSON and
// reads them back through the query API.
func TestSpansGoInAndComeBack(t *testing.T) {
	if _, err := Binary(); err != nil {
		testutil.Missing(t, err.Error())
	}
	j := Start(t)
	const trace = "5b8efff798038103d269b633813fc60c"
	now := time.Now().UnixNano()
	ns := func(d time.Duration) string { return strconv.FormatInt(now+int64(d), 10) }
	body := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"jaegertest"}}]},
"scopeSpans":[{"spans":[
 {"traceId":"` + trace + `","spanId":"eee19b7ec3c1b174","name":"parent","kind":2,"startTimeUnixNano":"` + ns(0) + `","endTimeUnixNano":"` + ns(time.Millisecond) + `"},
 {"traceId":"` + trace + `","spanId":"eee19b7ec3c1b175","parentSpanId":"eee19b7ec3c1b174","name":"child","kind":1,
  "startTimeUnixNano":"` + ns(100*time.Microsecond) + `","endTimeUnixNano":"` + ns(500*time.Microsecond) + `",
  "attributes":[{"key":"tandem.attempt","value":{"intValue":"1"}}],
  "events":[{"name":"first_token","timeUnixNano":"` + ns(200*time.Microsecond) + `"}],
  "status":{"code":2,"message":"broken"}}
]}]}]}`
	resp, err := http.Post(j.OTLP+"/v1/traces", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("OTLP export: %s", resp.Status)
	}
	var spans []Span
	testutil.WaitFor(t, "the trace in Jaeger", 30*time.Second, func() bool {
		spans, err = j.Trace(context.Background(), trace)
		if err != nil && !errors.Is(err, ErrNoTrace) {
			t.Fatal(err)
		}
		return len(spans) == 2
	})
	byName := map[string]*Span{}
	for i := range spans {
		byName[spans[i].OperationName] = &spans[i]
	}
	parent, child := byName["parent"], byName["child"]
	if parent == nil || child == nil {
		t.Fatalf("spans %+v; want parent and child", spans)
	}
	if child.ParentID() != parent.SpanID || parent.ParentID() != "" {
		t.Errorf("child's parent %q, parent's %q; want %q and none", child.ParentID(), parent.ParentID(), parent.SpanID)
	}
	if got := child.Tag("tandem.attempt"); got != "1" {
		t.Errorf("tandem.attempt = %q, want 1", got)
	}
	if got := child.Tag("otel.status_code"); got != "ERROR" {
		t.Errorf("otel.status_code = %q, want ERROR", got)
	}
	if ev := child.Events(); len(ev) != 1 || ev[0] != "first_token" {
		t.Errorf("events %v, want [first_token]", ev)
	}
	if child.Service != "jaegertest" {
		t.Errorf("service %q, want jaegertest", child.Service)
	}
	if _, err := j.Trace(context.Background(), "0000000000000000000000000000abcd"); !errors.Is(err, ErrNoTrace) {
		t.Errorf("an unknown trace: %v, want ErrNoTrace", err)
	}
}
