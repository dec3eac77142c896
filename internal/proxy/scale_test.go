package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/tracing"
)

func TestManyBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 144 engines")
	}
	var pre, dec []*fakeEngine
	for range 16 {
		pre = append(pre, newFake(t, prefillOK))
	}
	// Every decode leg waits until all 512 have arrived (or a minute), so
	// none finishes and frees its slot before the last is dispatched,
	// however slow the machine (the race detector): the spread then shows
	// the dispatch-time accounting alone. The proxy's Timeout is longer
	// than that wait: with startProxy's 5 s, legs that waited for a slow
	// dispatch (8.7 s under -race on a loaded machine) timed out and were
	// retried (decode_retry) instead of answering remote.
	const n = 512
	var arrived atomic.Int32
	all := make(chan struct{})
	barrier := func(w http.ResponseWriter, r *http.Request, body []byte) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
		}
		decodeJSON(w, r, body)
	}
	for range 128 {
		dec = append(dec, newFake(t, barrier))
	}
	_, url := startProxy(t, Config{Fallback: true, Policy: factory.PolicyPrefix, PDDecider: "conditional", ScrapeInterval: -1,
		Timeout: 2 * time.Minute, Router: factory.Options{Threshold: 8}}, pre, dec)
	var wg sync.WaitGroup
	var mu sync.Mutex
	pd := map[string]int{}
	for i := range n {
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

// BenchmarkProxyThroughput is requests/s with tiny engines (4 prefill, 4
// decode) and 16 clients in parallel, all on this machine, and the CPU time
// a request costs:
//
//	direct=decode          client → decode, no proxy: one HTTP leg's cost
//	direct=prefill+decode  client → prefill, then → decode, no proxy
//	decider=always         through the proxy, prefilled remotely (3 legs)
//	decider=conditional    through the proxy, decided local (2 legs)
//	decider=*-proxy-process  the same with the proxy alone in a child
//	                       process, whose CPU is the proxy's own
//
// cpu-µs/req is this process's CPU per request (client, engines, and the
// proxy unless it runs apart); proxy-cpu-µs/req is the child proxy's, and
// 1e6 over it is the requests/s one core of proxy serves. The clients use
// the proxy's own leg transport (httpleg), the cheapest client here, since
// they share the cores with what they measure;
// TANDEM_PROXY_BENCH_NETHTTP_CLIENT=1 gives them net/http's instead (as
// before httpleg).
func BenchmarkProxyThroughput(b *testing.B) {
	const clients = 16
	modes := []string{"direct=decode", "direct=prefill+decode", "decider=always", "decider=conditional",
		"decider=always-proxy-process", "decider=conditional-proxy-process"}
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
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
			decider, _, apart := strings.Cut(strings.TrimPrefix(mode, "decider="), "-")
			var target string
			var child *benchChild
			switch {
			case strings.HasPrefix(mode, "direct"):
			case apart:
				child = startBenchChild(b, benchChildConfig{Prefill: pre, Decode: dec, Decider: decider})
				target = child.url
			default:
				p, err := New(benchProxyConfig(pre, dec, decider))
				if err != nil {
					b.Fatal(err)
				}
				p.CheckHealth(b.Context())
				srv := newBenchServer(p.ServeHTTP)
				b.Cleanup(srv.Close)
				target = srv.URL
			}
			// The load generator is the cheapest client there is here (the
			// proxy's own leg transport): its CPU shares the cores with the
			// proxy and the engines.
			client := &http.Client{Transport: newLegTransport(time.Second)}
			if os.Getenv("TANDEM_PROXY_BENCH_NETHTTP_CLIENT") != "" {
				client = &http.Client{Transport: newTransport(time.Second)}
			}
			b.Cleanup(client.CloseIdleConnections)
			send := func(url string) bool {
				resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello","max_tokens":1}`))
				if err != nil {
					b.Error(err)
					return false
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK || b.Failed()
			}
			var next atomic.Uint64
			b.SetParallelism(clients / runtime.GOMAXPROCS(0))
			cpu0, proxy0 := processCPU(), child.cpu(b)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1)
					ok := true
					switch mode {
					case "direct=decode":
						ok = send(dec[i%4])
					case "direct=prefill+decode":
						ok = send(pre[i%4]) && send(dec[i%4])
					default:
						ok = send(target)
					}
					if !ok {
						b.Error("a request failed")
						return
					}
				}
			})
			elapsed := time.Since(start)
			cpu, proxyCPU := processCPU()-cpu0, child.cpu(b)-proxy0
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
			}
			if child != nil {
				b.ReportMetric(float64(proxyCPU.Microseconds())/float64(b.N), "proxy-cpu-µs/req")
			}
		})
	}
}

// benchProxyConfig is the proxy the throughput benchmark measures.
func benchProxyConfig(pre, dec []string, decider string) Config {
	return Config{Prefill: pre, Decode: dec, Fallback: true, ScrapeInterval: -1, Policy: factory.PolicyPrefix, PDDecider: decider, Logger: discardLogger()}
}

// benchChildEnv, set to a JSON benchChildConfig, makes
// TestBenchProxyProcess serve a proxy for BenchmarkProxyThroughput in a
// process of its own.
const benchChildEnv = "TANDEM_PROXY_BENCH_CHILD"

// benchChildProfileEnv, when set, is where the child proxy writes its CPU
// profile (go test's -cpuprofile profiles the benchmark's process only).
const benchChildProfileEnv = "TANDEM_PROXY_BENCH_CPUPROFILE"

type benchChildConfig struct {
	Prefill, Decode []string
	Decider         string
}

// benchCPUPath answers the child's CPU time so far, in µs.
const benchCPUPath = "/bench/cpu"

// TestBenchProxyProcess is the child process of BenchmarkProxyThroughput's
// *-proxy-process modes; it is skipped in a normal test run. It serves the
// proxy on a loopback port, prints the port's URL, and exits when its stdin
// closes.
func TestBenchProxyProcess(t *testing.T) {
	spec := os.Getenv(benchChildEnv)
	if spec == "" {
		t.Skip("the child process of BenchmarkProxyThroughput")
	}
	var c benchChildConfig
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		t.Fatal(err)
	}
	// Traced when the OTEL_* environment says so: the cost of tracing on.
	stopTracing, err := tracing.Setup(t.Context(), tracing.Config{ServiceName: "tandem-proxy-bench"})
	if err != nil {
		t.Fatal(err)
	}
	defer stopTracing(context.Background())
	p, err := New(benchProxyConfig(c.Prefill, c.Decode, c.Decider))
	if err != nil {
		t.Fatal(err)
	}
	p.CheckHealth(t.Context())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(benchCPUPath, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, processCPU().Microseconds())
	})
	mux.Handle("/", p)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	fmt.Printf("http://%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}

// benchChild is a proxy in a child process.
type benchChild struct {
	url string
}

// startBenchChild runs TestBenchProxyProcess in a child process of this
// test binary and returns once it serves.
func startBenchChild(b *testing.B, c benchChildConfig) *benchChild {
	spec, _ := json.Marshal(c)
	args := []string{"-test.run=^TestBenchProxyProcess$", "-test.count=1"}
	if path := os.Getenv(benchChildProfileEnv); path != "" {
		args = append(args, "-test.cpuprofile="+path)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), benchChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("child proxy: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return &benchChild{url: strings.TrimSpace(line)}
}

// cpu returns the child's CPU time so far (0 for no child).
func (c *benchChild) cpu(b *testing.B) time.Duration {
	if c == nil {
		return 0
	}
	resp, err := http.Get(c.url + benchCPUPath)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	us, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		b.Fatalf("child proxy CPU %q: %v", data, err)
	}
	return time.Duration(us) * time.Microsecond
}
