package jaegertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// Script is the repository-relative path of the script that builds the
// binary into the cache Binary looks in.
const Script = "scripts/jaeger-binary.sh"

// Version is the pinned Jaeger module version; the script pins the same.
const Version = "v1.75.0"

// ErrNoTrace means Jaeger holds no trace of the id asked for (yet).
var ErrNoTrace = errors.New("jaegertest: no such trace")

// Binary returns the jaeger binary: $TANDEM_JAEGER, else the one the
// script caches.
func Binary() (string, error) {
	if p := os.Getenv("TANDEM_JAEGER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("jaegertest: TANDEM_JAEGER=%s: %w (build it with bash %s)", p, err, Script)
		}
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("jaegertest: no cache directory (%w); run bash %s and set TANDEM_JAEGER to the path it prints", err, Script)
	}
	p := filepath.Join(cache, "tandem", "jaeger", Version, "bin", "jaeger")
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("jaegertest: no jaeger binary at %s; build it with bash %s (or set TANDEM_JAEGER)", p, Script)
	}
	return p, nil
}

// Jaeger is a running Jaeger on loopback.
type Jaeger struct {
	// OTLP is its OTLP/HTTP receiver, http://127.0.0.1:<port> (spans go to
	// /v1/traces).
	OTLP string
	// Query is its query service's HTTP address, http://127.0.0.1:<port>.
	Query string
	// Log is the file its output goes to.
	Log string
}

// Start runs Jaeger with in-memory storage on free loopback ports, waits
// until its receiver and query API answer, and stops it when the test
// ends. Without the binary it skips the test, or fails it under
// TANDEM_REQUIRE_TESTDATA.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		testutil.Missing(t, err.Error())
	}
	ports, err := testutil.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	otlp := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	query := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	grpc := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2]))
	dir := t.TempDir()
	conf := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(conf, []byte(config(otlp, query, grpc)), 0o644); err != nil {
		t.Fatal(err)
	}
	j := &Jaeger{OTLP: "http://" + otlp, Query: "http://" + query, Log: filepath.Join(dir, "jaeger.log")}
	cmd := exec.Command(bin, "--config", "file:"+conf)
	exited := testutil.StartLogged(t, cmd, j.Log)
	testutil.WaitStarted(t, "jaegertest: jaeger", exited, j.Log, 60*time.Second, j.ready)
	return j
}

// config is Jaeger's configuration: an OTLP/HTTP receiver, memory storage
// and the query extension, nothing else listening (no gRPC receiver, no
// self-telemetry endpoint), so tests can run several side by side.
func config(otlp, query, grpc string) string {
	return `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: ` + query + `
    grpc:
      endpoint: ` + grpc + `
receivers:
  otlp:
    protocols:
      http:
        endpoint: ` + otlp + `
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`
}

// ready reports whether the query API and the OTLP receiver answer.
func (j *Jaeger) ready() bool {
	resp, err := http.Get(j.Query + "/api/services")
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	// The receiver answers an empty export (a JSON body with no spans).
	resp, err = http.Post(j.OTLP+"/v1/traces", "application/json", http.NoBody)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode < 500
}

// Span is one span as Jaeger's query API returns it.
type Span struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"` // CHILD_OF or FOLLOWS_FROM
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64 `json:"startTime"` // µs since the epoch
	Duration  int64 `json:"duration"`  // µs
	Tags      []KV  `json:"tags"`
	Logs      []struct {
		Timestamp int64 `json:"timestamp"`
		Fields    []KV  `json:"fields"`
	} `json:"logs"`
	ProcessID string `json:"processID"`
	// Service is the span's process's service name (from the trace's
	// processes).
	Service string `json:"-"`
}

// KV is a tag or a log field.
type KV struct {
	Key   string `json:"key"`
	Type  string `json:"type"` // string, bool, int64, float64, binary
	Value any    `json:"value"`
}

// ParentID is the span's CHILD_OF reference's span id ("" for a root).
func (s *Span) ParentID() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Tag returns the tag key's value as text ("" when absent): numbers in
// decimal, booleans as true or false.
func (s *Span) Tag(key string) string {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return text(kv.Value)
		}
	}
	return ""
}

// Events returns the names of the span's events (Jaeger's logs with an
// "event" field).
func (s *Span) Events() []string {
	var out []string
	for _, l := range s.Logs {
		for _, f := range l.Fields {
			if f.Key == "event" {
				out = append(out, text(f.Value))
			}
		}
	}
	return out
}

func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// Trace reads trace id (32 hex digits) back through the query API,
// GET /api/traces/{id}. It wraps ErrNoTrace when Jaeger has none.
func (j *Jaeger) Trace(ctx context.Context, id string) ([]Span, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jaegertest: reading trace %s: %w", id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("jaegertest: reading trace %s: %w", id, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("trace %s: %w", id, ErrNoTrace)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaegertest: trace %s: %s: %s", id, resp.Status, body)
	}
	var out struct {
		Data []struct {
			TraceID   string `json:"traceID"`
			Spans     []Span `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("jaegertest: trace %s: %w", id, err)
	}
	var spans []Span
	for _, tr := range out.Data {
		for _, s := range tr.Spans {
			s.Service = tr.Processes[s.ProcessID].ServiceName
			spans = append(spans, s)
		}
	}
	if len(spans) == 0 {
		return nil, fmt.Errorf("trace %s: %w", id, ErrNoTrace)
	}
	return spans, nil
}
