package kubediscovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// engine is a stand-in engine on loopback that drains like a Tandem engine
// on SIGTERM: new requests and /health get 503, requests in flight finish.
type engine struct {
	srv      *httptest.Server
	draining atomic.Bool
	served   atomic.Int64
}

func newEngine(t *testing.T, role string) *engine {
	e := &engine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e.draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"the server is shutting down; retry on another instance"}}`)
			return
		}
		if r.URL.Path == "/health" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		e.served.Add(1)
		if role == RolePrefill {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":[[1]],"remote_host":"198.18.0.1","remote_port":5600}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond) // streams are in flight when a drain starts
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// mapped hands the proxy loopback URLs for the slices' 198.18.0.0/15
// addresses: the API server refuses loopback addresses in slices, and
// those addresses are not ours to dial (the end-to-end test with engines
// in network namespaces uses them for real).
type mapped struct {
	p  *proxy.Proxy
	to map[string]string
}

func (m mapped) SetBackends(role string, urls []string) error {
	out := make([]string, 0, len(urls))
	for _, u := range urls {
		l, ok := m.to[u]
		if !ok {
			return fmt.Errorf("no engine stands for %s", u)
		}
		out = append(out, l)
	}
	return m.p.SetBackends(role, out)
}

// TestProxyFollowsSlicesUnderLoad runs a bounded load through a real
// proxy fed by the Watcher while the pools change through the real API
// server: a decode is added, a decode turns unready while it drains (its
// requests in flight finish, new ones get 503 and are retried), a prefill
// terminates and drains likewise, and the slices are then removed. No
// request is lost.
func TestProxyFollowsSlicesUnderLoad(t *testing.T) {
	k := newKube(t)
	pre := []*engine{newEngine(t, RolePrefill), newEngine(t, RolePrefill)}
	dec := []*engine{newEngine(t, RoleDecode), newEngine(t, RoleDecode), newEngine(t, RoleDecode)}
	to := map[string]string{}
	for i, e := range pre {
		to[fmt.Sprintf("http://198.18.0.%d:8000", 1+i)] = e.srv.URL
	}
	for i, e := range dec {
		to[fmt.Sprintf("http://198.18.0.%d:8000", 11+i)] = e.srv.URL
	}
	p, err := proxy.New(proxy.Config{DynamicBackends: true, ScrapeInterval: -1, HealthInterval: 50 * time.Millisecond,
		Timeout: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()
	defer func() { cancel(); <-served }()
	url := "http://" + ln.Addr().String()

	ps := k.create(t, slice("prefill", "tandem-prefill", nil, ready("198.18.0.1"), ready("198.18.0.2")))
	ds := k.create(t, slice("decode", "tandem-decode", nil, ready("198.18.0.11"), ready("198.18.0.12")))
	w, _, _ := k.run(t, Config{Backends: mapped{p, to}, Registerer: p.MetricsRegisterer(), Pools: []Pool{
		{Role: RolePrefill, Selector: ServiceSelector("tandem-prefill")},
		{Role: RoleDecode, Selector: ServiceSelector("tandem-decode")},
	}})
	testutil.WaitFor(t, "the watcher synced and the proxy ready", waitLimit, func() bool { return w.Synced() && p.Ready() })

	const clients, perClient = 6, 40
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for range clients {
		wg.Go(func() {
			for range perClient {
				sent.Add(1)
				resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
				var body []byte
				if err == nil {
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || resp.Header.Get(proxy.HeaderPD) != "remote" {
					failed.Add(1)
					mu.Lock()
					if err != nil {
						failures = append(failures, err.Error())
					} else {
						failures = append(failures, fmt.Sprintf("%d %s %q", resp.StatusCode, resp.Header.Get(proxy.HeaderPD), body))
					}
					mu.Unlock()
				}
			}
		})
	}
	at := func(n int64) {
		testutil.WaitFor(t, fmt.Sprintf("%d requests sent", n), waitLimit, func() bool { return sent.Load() >= n })
	}
	total := int64(clients * perClient)
	// Scale the decode pool up.
	at(total / 5)
	ds, _ = k.update(t, ds, ready("198.18.0.11"), ready("198.18.0.12"), ready("198.18.0.13"))
	// A decode pod turns unready as its engine drains (SIGTERM): the engine
	// refuses at once, the slice follows.
	at(2 * total / 5)
	dec[0].draining.Store(true)
	ds, _ = k.update(t, ds, unready("198.18.0.11"), ready("198.18.0.12"), ready("198.18.0.13"))
	// A prefill pod terminates likewise.
	at(3 * total / 5)
	pre[0].draining.Store(true)
	ps, _ = k.update(t, ps, terminating("198.18.0.1"), ready("198.18.0.2"))
	// The pods are gone.
	at(4 * total / 5)
	k.update(t, ds, ready("198.18.0.12"), ready("198.18.0.13"))
	k.update(t, ps, ready("198.18.0.2"))
	wg.Wait()

	for _, f := range failures {
		t.Error(f)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests lost while the pools changed", failed.Load(), sent.Load())
	}
	if dec[2].served.Load() == 0 {
		t.Error("the decode added mid-load served nothing")
	}
	// The proxy's set is the slices' ready endpoints.
	var h struct {
		Prefill, Decode []struct{ URL string }
	}
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Prefill) != 1 || h.Prefill[0].URL != pre[1].srv.URL || len(h.Decode) != 2 {
		t.Errorf("proxy pools at the end: %s", b)
	}
	metrics, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer metrics.Body.Close()
	mb, _ := io.ReadAll(metrics.Body)
	for _, name := range []string{"tandem:proxy_discovery_update_seconds_count{role=\"decode\"} 2", "tandem:proxy_discovery_update_seconds_count{role=\"prefill\"} 1", "tandem:proxy_discovery_backends{role=\"decode\"} 2", "tandem:proxy_discovery_synced{role=\"prefill\"} 1"} {
		if !strings.Contains(string(mb), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	t.Logf("%d requests, none lost", sent.Load())
}
