package proxy

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router/factory"
)

func TestManyBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 144 engines")
	}
	var pre, dec []*fakeEngine
	for range 16 {
		pre = append(pre, newFake(t, prefillOK))
	}
	for range 128 {
		dec = append(dec, newFake(t, slowDecode(20*time.Millisecond)))
	}
	_, url := startProxy(t, Config{Fallback: true, Policy: factory.PolicyPrefix, PDDecider: "conditional", ScrapeInterval: -1,
		Router: factory.Options{Threshold: 8}}, pre, dec)
	var wg sync.WaitGroup
	var mu sync.Mutex
	pd := map[string]int{}
	for i := range 512 {
		wg.Go(func() {
			resp, body := post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":"request %d with a prompt long enough to go remote"}`, i), nil)
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
				t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
			}
			pd[resp.Header.Get(HeaderPD)]++
		})
	}
	wg.Wait()
	c := counts(dec)
	if slices.Min(c) < 2 || slices.Max(c) > 6 {
		t.Errorf("512 requests over 128 decodes: min %d max %d per decode, want about 4 each", slices.Min(c), slices.Max(c))
	}
	if pd["remote"] != 512 {
		t.Errorf("decisions %v, want all remote", pd)
	}
}

// tinyDecode answers a one-token completion at once.
func tinyDecode(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
}

// tinyEngine is a fake engine without request recording, for benchmarks.
func tinyEngine(b *testing.B, handle http.HandlerFunc) string {
	srv := newBenchServer(handle)
	b.Cleanup(srv.Close)
	return srv.URL
}

func percentile(d []time.Duration, q float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(q*float64(len(d)-1))]
}

// BenchmarkProxyAddedLatency compares one request sent straight to a tiny
// decode engine with the same request through the proxy: decided local (one
// leg: the proxy's own cost) and remote (prefill + decode legs). It reports
// p50 and p99 in µs.
func BenchmarkProxyAddedLatency(b *testing.B) {
	pre := tinyEngine(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		prefillOK(w, r, nil)
	})
	dec := tinyEngine(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tinyDecode(w, r, nil)
	})
	client := &http.Client{Transport: newTransport(time.Second)}
	b.Cleanup(client.CloseIdleConnections)
	body := `{"prompt":"hello","max_tokens":1}`
	for _, mode := range []string{"direct", "proxy-local", "proxy-remote"} {
		b.Run(mode, func(b *testing.B) {
			target := dec
			if mode != "direct" {
				cfg := Config{Prefill: []string{pre}, Decode: []string{dec}, Fallback: true, ScrapeInterval: -1, Policy: factory.PolicyLoad,
					Logger: discardLogger()}
				if mode == "proxy-local" {
					cfg.PDDecider = "conditional"
				}
				p, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				p.CheckHealth(b.Context())
				srv := newBenchServer(p.ServeHTTP)
				b.Cleanup(srv.Close)
				target = srv.URL
			}
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				resp, err := client.Post(target+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(t0))
			}
			b.ReportMetric(float64(percentile(lat, 0.5).Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// BenchmarkProxyThroughput is requests/s through the proxy with tiny engines
// (4 prefill, 4 decode), clients in parallel.
func BenchmarkProxyThroughput(b *testing.B) {
	for _, pd := range []string{"always", "conditional"} {
		b.Run("decider="+pd, func(b *testing.B) {
			var pre, dec []string
			for range 4 {
				pre = append(pre, tinyEngine(b, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					prefillOK(w, r, nil)
				}))
				dec = append(dec, tinyEngine(b, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					tinyDecode(w, r, nil)
				}))
			}
			p, err := New(Config{Prefill: pre, Decode: dec, Fallback: true, ScrapeInterval: -1, Policy: factory.PolicyPrefix, PDDecider: pd, Logger: discardLogger()})
			if err != nil {
				b.Fatal(err)
			}
			p.CheckHealth(b.Context())
			srv := newBenchServer(p.ServeHTTP)
			b.Cleanup(srv.Close)
			client := &http.Client{Transport: newTransport(time.Second)}
			b.Cleanup(client.CloseIdleConnections)
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello","max_tokens":1}`))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
