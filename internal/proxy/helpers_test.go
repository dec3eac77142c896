package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tandem-serve/tandem/internal/httpleg"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// received is one request a fake engine got on an API path.
type received struct {
	Path   string
	Body   string
	Header http.Header
}

// fakeEngine plays a prefill or decode engine on a loopback server and
// records what it receives.
type fakeEngine struct {
	t      *testing.T
	srv    *httptest.Server
	health atomic.Int32 // status of GET /health; 200 unless set
	mu     sync.Mutex
	got    []received
}

// newFake starts an engine whose API paths are served by handle (called
// after the request has been recorded, with its body already read).
func newFake(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
	t.Helper()
	return newFakeOn(t, nil, handle)
}

// newFakeOn is newFake on the in-memory network mem (nil: a loopback
// server), for a test in a testing/synctest bubble.
func newFakeOn(t *testing.T, mem *testutil.MemNet, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
	t.Helper()
	f := &fakeEngine{t: t}
	f.health.Store(http.StatusOK)
	f.srv = newServerOn(mem, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.WriteHeader(int(f.health.Load()))
			return
		}
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.got = append(f.got, received{Path: r.URL.Path, Body: string(body), Header: r.Header.Clone()})
		f.mu.Unlock()
		handle(w, r, body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) URL() string { return f.srv.URL }

// requests returns what the engine has received so far.
func (f *fakeEngine) requests() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.got...)
}

// testKV is a prefill answer's kv_transfer_params with odd spacing and
// number spellings, to check that it reaches decode verbatim.
const testKV = `{"do_remote_prefill": true, "do_remote_decode":false,"remote_block_ids":[[3, 1,4]],"remote_engine_id":"p-0","remote_request_id":"r-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1,"remote_num_tokens":1.0e1}`

// prefillOK answers like a prefill engine that kept the KV.
func prefillOK(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"x"}],"kv_transfer_params":`+testKV+`}`)
}

// decodeJSON answers like a decode engine with a non-streaming response.
func decodeJSON(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"cmpl-2","choices":[{"text":"hello"}]}`)
}

// startProxy returns a proxy over the given engines, health-checked once,
// and the URL of a loopback server running it.
func startProxy(t *testing.T, cfg Config, prefill, decode []*fakeEngine) (*Proxy, string) {
	t.Helper()
	return startProxyOn(t, nil, cfg, prefill, decode)
}

// startProxyOn is startProxy on the in-memory network mem (nil: loopback),
// the proxy's backend calls dialled through it too.
func startProxyOn(t *testing.T, mem *testutil.MemNet, cfg Config, prefill, decode []*fakeEngine) (*Proxy, string) {
	t.Helper()
	for _, f := range prefill {
		cfg.Prefill = append(cfg.Prefill, f.URL())
	}
	for _, f := range decode {
		cfg.Decode = append(cfg.Decode, f.URL())
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if mem != nil {
		p.client.Transport.(*httpleg.Transport).DialContext = mem.Dial
	}
	p.CheckHealth(context.Background())
	srv := newServerOn(mem, p)
	t.Cleanup(func() {
		srv.Close()
		p.client.CloseIdleConnections()
	})
	return p, srv.URL
}

// newServerOn starts a server for h on mem, or on loopback when mem is nil.
func newServerOn(mem *testutil.MemNet, h http.Handler) *httptest.Server {
	if mem == nil {
		return httptest.NewServer(h)
	}
	srv := &httptest.Server{Listener: mem.Listen(), Config: &http.Server{Handler: h}}
	srv.Start()
	return srv
}

// inBubble runs body in a testing/synctest bubble with an in-memory
// network and a client on it: fake time advances only while the proxy,
// its engines and the client all wait, so timing is the test's alone,
// however loaded the machine.
func inBubble(t *testing.T, body func(t *testing.T, mem *testutil.MemNet, client *http.Client)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		mem := testutil.NewMemNet()
		body(t, mem, memClient(t, mem))
	})
}

// memClient is a client whose connections go through mem.
func memClient(t *testing.T, mem *testutil.MemNet) *http.Client {
	c := &http.Client{Transport: &http.Transport{DialContext: mem.Dial}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// post sends body to the proxy and returns the response with its body read.
func post(t *testing.T, url, path, body string, header http.Header) (*http.Response, string) {
	t.Helper()
	return postWith(t, http.DefaultClient, url, path, body, header)
}

// postWith is post through client.
func postWith(t *testing.T, client *http.Client, url, path, body string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading answer of POST %s: %v", path, err)
	}
	return resp, string(b)
}

// metricValue returns the value of the counter or gauge name with the
// given labels, or of a histogram's sample count; 0 when absent.
func metricValue(t *testing.T, p *Proxy, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := p.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if labelValue(m, k) != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newBenchServer(h http.HandlerFunc) *httptest.Server { return httptest.NewServer(h) }
