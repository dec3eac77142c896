package kube

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tandem-serve/tandem/internal/kubetest"
	"github.com/tandem-serve/tandem/internal/testhosts"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

const (
	namespace   = "tandem-e2e"
	prefillSvc  = "tandem-prefill"
	decodeSvc   = "tandem-decode"
	enginePort  = 8000
	kvPort      = 5600
	apiKey      = "e2e-api-key"
	servedName  = "m"
	waitTimeout = 60 * time.Second
)

var (
	workDir   string
	buildOnce sync.Once
	binPath   string
	buildErr  error
	client    = &http.Client{Timeout: 60 * time.Second}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tandem-kube-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	code := kubetest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func tandemBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out := filepath.Join(workDir, "tandem")
		cmd := exec.Command("go", "build", "-o", out, "github.com/tandem-serve/tandem/cmd/tandem")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tandem: %v\n%s", err, b)
			return
		}
		binPath = out
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is a tandem process and where its output goes.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, log: filepath.Join(workDir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.tail())
		}
	})
	return p
}

// engine is a `tandem serve` in a host of its own.
type engine struct {
	*proc
	host *testhosts.Host
	role string
	url  string
}

func startEngine(t *testing.T, bin, model, secret string, h *testhosts.Host, role, name string) *engine {
	t.Helper()
	args := []string{"serve", "--model", model, "--served-model-name", servedName, "--role", role,
		"--host", "0.0.0.0", "--port", strconv.Itoa(enginePort), "--kv-secret-file", secret,
		"--api-key", apiKey, "--engine-id", name, "--shutdown-timeout", "20s"}
	if role == "prefill" {
		args = append(args, "--kv-host", h.IP, "--kv-port", strconv.Itoa(kvPort))
	} else {
		// Every engine here shares the machine's boot id, so auto would
		// pick shared memory; TCP makes the KV cross the interface, as it
		// does between nodes.
		args = append(args, "--kv-transport", "tcp")
	}
	cmd := h.Command(context.Background(), bin, args...)
	return &engine{proc: startProc(t, name, cmd), host: h, role: role, url: fmt.Sprintf("http://%s:%d", h.IP, enginePort)}
}

func (e *engine) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		if e.exited() {
			t.Fatalf("%s exited before it was healthy: %v\n%s", e.name, e.err, e.tail())
		}
		if resp, err := client.Get(e.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not healthy at %s within %s:\n%s", e.name, e.url, waitTimeout, e.tail())
}

// metric sums every series of name in the engine's /metrics.
func (e *engine) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := client.Get(e.url + "/metrics")
	if err != nil {
		t.Fatalf("%s metrics: %v", e.name, err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// sigterm asks the engine to drain and waits for a clean exit.
func (e *engine) sigterm(t *testing.T) time.Duration {
	t.Helper()
	begin := time.Now()
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.wait(t)
	return time.Since(begin)
}

// wait waits for the engine to exit cleanly (after a SIGTERM sent
// already) and returns when it had.
func (e *engine) wait(t *testing.T) time.Time {
	t.Helper()
	select {
	case <-e.done:
	case <-time.After(waitTimeout):
		t.Fatalf("%s still running %s after SIGTERM:\n%s", e.name, waitTimeout, e.tail())
	}
	if e.err != nil {
		t.Fatalf("%s drained with %v:\n%s", e.name, e.err, e.tail())
	}
	return time.Now()
}

// cluster is the API client and the proxy watching the slices.
type cluster struct {
	kc       kubernetes.Interface
	proxyURL string
}

func (c *cluster) slice(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	port, portName, proto := int32(enginePort), "http", corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
		Endpoints:   eps,
	}
}

// ep is an endpoint in the given state (ready; or not ready and, if
// terminating, still serving while it drains).
func ep(h *testhosts.Host, ready, terminating bool) discoveryv1.Endpoint {
	serving := ready || terminating
	return discoveryv1.Endpoint{
		Addresses:  []string{h.IP},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
	}
}

// apply creates or replaces a slice and returns when the API server has it,
// and when the write was sent.
func (c *cluster) apply(t *testing.T, s *discoveryv1.EndpointSlice) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api := c.kc.DiscoveryV1().EndpointSlices(namespace)
	cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	sent := time.Now()
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("apply EndpointSlice %s: %v", s.Name, err)
	}
	return sent
}

type backendSet struct {
	Prefill []string `json:"prefill"`
	Decode  []string `json:"decode"`
}

func (c *cluster) backends() (backendSet, error) {
	req, _ := http.NewRequest(http.MethodGet, c.proxyURL+"/tandem/admin/backends", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		return backendSet{}, err
	}
	defer resp.Body.Close()
	var s backendSet
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return s, fmt.Errorf("admin backends: %s: %s", resp.Status, b)
	}
	err = json.NewDecoder(resp.Body).Decode(&s)
	return s, err
}

func urls(es ...*engine) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.url)
	}
	sort.Strings(out)
	return out
}

// waitBackends polls the proxy until its backend set is want and returns
// how long that took from since.
func (c *cluster) waitBackends(t *testing.T, since time.Time, prefill, decode []*engine) time.Duration {
	t.Helper()
	want := backendSet{Prefill: urls(prefill...), Decode: urls(decode...)}
	deadline := time.Now().Add(15 * time.Second)
	var got backendSet
	var err error
	for time.Now().Before(deadline) {
		got, err = c.backends()
		if err == nil {
			sort.Strings(got.Prefill)
			sort.Strings(got.Decode)
			if slices.Equal(got.Prefill, want.Prefill) && slices.Equal(got.Decode, want.Decode) {
				return time.Since(since)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("proxy backends %+v (err %v), want %+v", got, err, want)
	return 0
}

// result is one request of the load.
type result struct {
	status int
	pd     string
	text   string
	err    error
	stream bool
}

func complete(ctx context.Context, base, prompt string, maxTokens int, stream bool) result {
	body, _ := json.Marshal(map[string]any{"model": servedName, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "stream": stream})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err, stream: stream}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode, pd: resp.Header.Get("X-Tandem-Pd"), stream: stream}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		r.err = fmt.Errorf("%s: %s", resp.Status, b)
		return r
	}
	if !stream {
		var out struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			r.err = fmt.Errorf("bad body: %v", err)
			return r
		}
		r.text = out.Choices[0].Text
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	var sb strings.Builder
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ch struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			r.err = fmt.Errorf("bad chunk %q: %v", line, err)
			return r
		}
		if ch.Error != nil {
			r.err = fmt.Errorf("error in stream: %s", ch.Error.Message)
			return r
		}
		for _, c := range ch.Choices {
			sb.WriteString(c.Text)
		}
	}
	if !done {
		r.err = fmt.Errorf("stream ended without [DONE] (%v)", sc.Err())
	}
	r.text = sb.String()
	return r
}

// load sends requests from workers until stop is closed or max requests
// were sent, and returns every result.
type load struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []result
	bad     []string
}

var prompts = []string{
	"Once upon a time",
	"One day, a little girl named Lily",
	"The cat sat on the mat and",
	"Tom had a big red ball.",
}

const maxTokens = 24

func startLoad(base string, workers, max int, want map[string]string) *load {
	l := &load{stop: make(chan struct{})}
	var sent sync.Mutex
	n := 0
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ; i += workers {
				select {
				case <-l.stop:
					return
				default:
				}
				sent.Lock()
				if n >= max {
					sent.Unlock()
					return
				}
				n++
				sent.Unlock()
				p := prompts[i%len(prompts)]
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				r := complete(ctx, base, p, maxTokens, i%2 == 1)
				cancel()
				l.mu.Lock()
				l.results = append(l.results, r)
				switch {
				case r.err != nil:
					l.bad = append(l.bad, fmt.Sprintf("%q stream=%v: %v", p, r.stream, r.err))
				case r.text != want[p]:
					l.bad = append(l.bad, fmt.Sprintf("%q stream=%v: answer %q, want %q (pd %q)", p, r.stream, r.text, want[p], r.pd))
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *load) count() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.results) }

// waitMore waits until k more requests than now have finished, right or
// wrong, and fails t after waitTimeout: the proxy stopped answering, or
// the load ran out of requests.
func (l *load) waitMore(t *testing.T, k int, while string) {
	t.Helper()
	n := l.count()
	testutil.WaitFor(t, fmt.Sprintf("%d more requests to finish under load %s", k, while), waitTimeout, func() bool { return l.count() >= n+k })
}

func (l *load) finish() ([]result, []string) {
	close(l.stop)
	l.wg.Wait()
	return l.results, l.bad
}

// waitServed waits until e has finished more requests than before.
func waitServed(t *testing.T, e *engine, before float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if e.metric(t, "vllm:request_success_total") > before {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s received no request within 30 s of joining", e.name)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// TestDiscoveryScalesPoolsWithoutLosingRequests runs two prefill and two
// decode engines on four separate hosts behind a proxy that finds them in
// EndpointSlices, and changes the slices under load as Kubernetes does
// when pools scale up, a pod turns unready and pods drain on scale-down.
func TestDiscoveryScalesPoolsWithoutLosingRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engines in network namespaces and a control plane")
	}
	cp := kubetest.Shared(t)
	model := testmodels.Stories260K(t)
	nt := testhosts.New(t, 4)
	bin := tandemBinary(t)

	secret := filepath.Join(workDir, "kv.secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef-kube-e2e\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hs := nt.Hosts()
	p0 := startEngine(t, bin, model, secret, hs[0], "prefill", "prefill-0")
	p1 := startEngine(t, bin, model, secret, hs[1], "prefill", "prefill-1")
	d0 := startEngine(t, bin, model, secret, hs[2], "decode", "decode-0")
	d1 := startEngine(t, bin, model, secret, hs[3], "decode", "decode-1")
	for _, e := range []*engine{p0, p1, d0, d1} {
		e.waitHealthy(t)
	}

	// The answers a colocated engine gives: d0 alone, asked directly.
	want := map[string]string{}
	for _, p := range prompts {
		r := complete(context.Background(), d0.url, p, maxTokens, false)
		if r.err != nil || r.text == "" {
			t.Fatalf("reference answer for %q: %+v", p, r)
		}
		want[p] = r.text
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// The test's own writes must not queue behind client-go's default
	// 5 requests/s limit: that would be measured as the proxy's latency.
	cfg.QPS, cfg.Burst = 1000, 1000
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kubectl(context.Background(), nil, "create", "namespace", namespace); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		t.Fatal(err)
	}
	// The control plane is shared by every run in this test binary
	// (-count=N): a slice left behind would name an engine of an earlier
	// run, gone, as a backend of this one.
	t.Cleanup(func() {
		if err := kc.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the test's EndpointSlices: %v", err)
		}
	})
	c := &cluster{kc: kc}
	c.apply(t, c.slice("prefill-a", prefillSvc, ep(p0.host, true, false)))
	c.apply(t, c.slice("decode-a", decodeSvc, ep(d0.host, true, false)))

	port := testutil.FreePort(t)
	c.proxyURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	proxy := startProc(t, "proxy", exec.Command(bin, "proxy", "--discovery", "kubernetes",
		"--kubeconfig", cp.Kubeconfig, "--kube-namespace", namespace,
		"--prefill-service", prefillSvc, "--decode-service", decodeSvc,
		"--port", strconv.Itoa(port), "--api-key", apiKey, "--policy", "round-robin", "--pd-decider", "always"))
	deadline := time.Now().Add(waitTimeout)
	for {
		if _, err := c.backends(); err == nil {
			break
		}
		if proxy.exited() || time.Now().After(deadline) {
			t.Fatalf("proxy did not come up: %v\n%s", proxy.err, proxy.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var acted []time.Duration
	acted = append(acted, c.waitBackends(t, time.Now(), []*engine{p0}, []*engine{d0}))
	// A backend is listed as soon as discovery adds it and serves once its
	// first health check passed: the proxy is ready then (a first request
	// sent on the listing alone got 503, no healthy decode, on a loaded
	// machine).
	testutil.WaitFor(t, "the proxy ready (its /health 200)", waitTimeout, func() bool {
		resp, err := client.Get(c.proxyURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	r := complete(context.Background(), c.proxyURL, prompts[0], maxTokens, false)
	if r.err != nil || r.pd != "remote" || r.text != want[prompts[0]] {
		t.Fatalf("first request through the proxy: status %d pd %q text %q err %v", r.status, r.pd, r.text, r.err)
	}

	l := startLoad(c.proxyURL, 3, 2000, want)
	finished := false
	t.Cleanup(func() {
		if !finished {
			l.finish()
		}
	})

	// Scale up: a second prefill joins slice a, a second decode arrives in
	// a second slice of the same Service.
	beforeP1, beforeD1 := p1.metric(t, "vllm:request_success_total"), d1.metric(t, "vllm:request_success_total")
	begin := time.Now()
	c.apply(t, c.slice("prefill-a", prefillSvc, ep(p0.host, true, false), ep(p1.host, true, false)))
	c.apply(t, c.slice("decode-b", decodeSvc, ep(d1.host, true, false)))
	acted = append(acted, c.waitBackends(t, begin, []*engine{p0, p1}, []*engine{d0, d1}))
	waitServed(t, p1, beforeP1)
	waitServed(t, d1, beforeD1)

	// A decode turns unready mid-load (its readiness probe failed): it
	// leaves the set, what it is serving finishes, and no request is lost.
	begin = time.Now()
	c.apply(t, c.slice("decode-a", decodeSvc, ep(d0.host, false, false)))
	acted = append(acted, c.waitBackends(t, begin, []*engine{p0, p1}, []*engine{d1}))
	l.waitMore(t, 15, "after decode-0 turned unready")

	// Scale down. d0, already out of the set, is deleted: terminating,
	// then SIGTERM, and it drains. p0 is deleted as Kubernetes does it:
	// the kubelet's SIGTERM and the slice update race, so requests still
	// reach p0 while it drains (it answers 503 and the proxy retries them
	// on p1) and p0 holds KV for decodes in flight.
	c.apply(t, c.slice("decode-a", decodeSvc, ep(d0.host, false, true)))
	drainD0 := d0.sigterm(t)
	if err := p0.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	termP0 := time.Now()
	l.waitMore(t, 3, "while prefill-0 drains")
	begin = c.apply(t, c.slice("prefill-a", prefillSvc, ep(p0.host, false, true), ep(p1.host, true, false)))
	acted = append(acted, c.waitBackends(t, begin, []*engine{p1}, []*engine{d1}))
	drainP0 := p0.wait(t).Sub(termP0)
	l.waitMore(t, 15, "after the scale-down")

	results, bad := l.finish()
	finished = true
	remote := 0
	for _, r := range results {
		if r.pd == "remote" {
			remote++
		}
	}
	t.Logf("%d requests under load, %d failed or wrong, %d remote; drains: decode %.2f s, prefill %.2f s; proxy acted on slice changes in %v",
		len(results), len(bad), remote, drainD0.Seconds(), drainP0.Seconds(), acted)
	if len(bad) > 0 {
		t.Fatalf("%d of %d requests lost while scaling, e.g.:\n%s", len(bad), len(results), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if remote < len(results)*9/10 {
		t.Errorf("only %d of %d requests went prefill → decode", remote, len(results))
	}

	// No KV left held on the engines that stay.
	for _, e := range []*engine{p1, d1} {
		deadline := time.Now().Add(15 * time.Second)
		for e.metric(t, "tandem:kv_blocks_held") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still holds %v KV blocks", e.name, e.metric(t, "tandem:kv_blocks_held"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if b := d1.metric(t, "tandem:kv_transfer_bytes_total"); b == 0 {
		t.Errorf("decode-1 pulled no KV bytes over the network")
	}

	// How fast the proxy acts on a change: flip the remaining prefill's
	// readiness back and forth.
	var flips []time.Duration
	for i := range 30 {
		ready := i%2 == 1
		begin := c.apply(t, c.slice("prefill-a", prefillSvc, ep(p0.host, false, true), ep(p1.host, ready, false)))
		var pre []*engine
		if ready {
			pre = []*engine{p1}
		}
		flips = append(flips, c.waitBackends(t, begin, pre, []*engine{d1}))
	}
	t.Logf("EndpointSlice update → proxy backend set changed: p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d changes",
		ms(percentile(flips, 0.5)), ms(percentile(flips, 0.99)), ms(slices.Max(flips)), len(flips))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
