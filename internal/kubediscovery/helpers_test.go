package kubediscovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tandem-serve/tandem/internal/kubetest"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// fakeClient is a client for a server that is never contacted.
func fakeClient() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"})
}

// call is one SetBackends call a recorder got.
type call struct {
	role string
	urls []string
	at   time.Time
}

// recorder is a Backends that records its calls: the thing under test is
// the Watcher, not the proxy.
type recorder struct {
	mu     sync.Mutex
	calls  []call
	notify chan struct{}
	fail   atomic.Int32 // the next n calls return an error
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) SetBackends(role string, urls []string) error {
	if r.fail.Load() > 0 {
		r.fail.Add(-1)
		return errors.New("injected: refused")
	}
	r.mu.Lock()
	r.calls = append(r.calls, call{role, slices.Clone(urls), time.Now()})
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	return nil
}

// of returns the calls for role.
func (r *recorder) of(role string) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []call
	for _, c := range r.calls {
		if c.role == role {
			out = append(out, c)
		}
	}
	return out
}

// last returns role's last set and whether there was a call.
func (r *recorder) last(role string) ([]string, bool) {
	cs := r.of(role)
	if len(cs) == 0 {
		return nil, false
	}
	return cs[len(cs)-1].urls, true
}

// waitLimit bounds the tests' waits for the API server, the informers and
// the watcher.
const waitLimit = 15 * time.Second

// callsBefore waits until role is handed want, the set a barrier change
// made after the change under test produces, and returns role's calls from
// the one numbered from up to that one: those the change under test caused.
// A pool's informer delivers the slice events of its watch in the order the
// API server wrote them, and the pool's worker applies them one after
// another, so by the time the barrier's set arrives every earlier change
// has been handled; a call it caused is among those returned, and a set it
// changed by mistake keeps want from arriving (wait fails).
func (r *recorder) callsBefore(t testing.TB, role string, from int, want ...string) []call {
	t.Helper()
	r.wait(t, role, want...)
	cs := r.of(role)
	for i := from; i < len(cs); i++ {
		if slices.Equal(cs[i].urls, want) {
			return cs[from:i]
		}
	}
	t.Fatalf("%s: no call of %q among %v", role, want, cs[from:])
	return nil
}

// wait waits until role's last set is want (nil and empty are equal) and
// returns the call.
func (r *recorder) wait(t testing.TB, role string, want ...string) call {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		cs := r.of(role)
		if len(cs) > 0 && slices.Equal(cs[len(cs)-1].urls, want) {
			return cs[len(cs)-1]
		}
		select {
		case <-r.notify:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			got, ok := r.last(role)
			t.Fatalf("%s: last set %q (called: %v), want %q", role, got, ok, want)
		}
	}
}

// kube is a test's view of the shared control plane: a client and a
// namespace of its own, deleted at the end.
type kube struct {
	cp     *kubetest.ControlPlane
	client kubernetes.Interface
	ns     string
}

func newKube(t testing.TB) *kube {
	t.Helper()
	cp := kubetest.Shared(t)
	k := &kube{cp: cp, client: clientFor(t, cp, nil)}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	k.ns = "kd-" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := k.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", k.ns, err)
	}
	t.Cleanup(func() { _ = k.client.CoreV1().Namespaces().Delete(context.Background(), k.ns, metav1.DeleteOptions{}) })
	return k
}

// clientFor returns a protobuf client of the admin user, its transport
// wrapped by wrap when set.
func clientFor(t testing.TB, cp *kubetest.ControlPlane, wrap func(http.RoundTripper) http.RoundTripper) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 1000, 1000 // the tests write fast
	if wrap != nil {
		rc.WrapTransport = wrap
	}
	c, err := NewClient(rc, "kubediscovery-test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// addr is an endpoint of a slice: 198.18.0.0/15 addresses (the apiserver
// refuses loopback ones), which nothing in these tests dials.
type addr struct {
	ip          string
	ready       *bool
	terminating *bool
}

func ready(ip string) addr   { return addr{ip: ip} }
func unready(ip string) addr { return addr{ip: ip, ready: new(false)} }
func terminating(ip string) addr {
	return addr{ip: ip, ready: new(true), terminating: new(true)}
}

// slice is an EndpointSlice of service with port "http" 8000 (and
// "metrics" 9000) and the given endpoints.
func slice(name, service string, extra map[string]string, addrs ...addr) *discoveryv1.EndpointSlice {
	typ := discoveryv1.AddressTypeIPv4
	if len(addrs) > 0 && strings.Contains(addrs[0].ip, ":") {
		typ = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		AddressType: typ,
		Ports: []discoveryv1.EndpointPort{
			{Name: new("metrics"), Port: new(int32(9000)), Protocol: new(corev1.ProtocolTCP)},
			{Name: new("http"), Port: new(int32(8000)), Protocol: new(corev1.ProtocolTCP)},
		},
	}
	if service != "" {
		s.Labels[ServiceNameLabel] = service
	}
	maps.Copy(s.Labels, extra)
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: a.ready, Terminating: a.terminating},
		})
	}
	return s
}

func (k *kube) create(t testing.TB, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	out, err := k.client.DiscoveryV1().EndpointSlices(k.ns).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating EndpointSlice %s: %v", s.Name, err)
	}
	return out
}

// update replaces the slice's endpoints (and labels, if given) and returns
// the time just before the call.
func (k *kube) update(t testing.TB, s *discoveryv1.EndpointSlice, addrs ...addr) (*discoveryv1.EndpointSlice, time.Time) {
	t.Helper()
	next := slice(s.Name, s.Labels[ServiceNameLabel], s.Labels, addrs...)
	next.ResourceVersion = s.ResourceVersion
	begin := time.Now()
	out, err := k.client.DiscoveryV1().EndpointSlices(k.ns).Update(context.Background(), next, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating EndpointSlice %s: %v", s.Name, err)
	}
	return out, begin
}

func (k *kube) delete(t testing.TB, name string) {
	t.Helper()
	if err := k.client.DiscoveryV1().EndpointSlices(k.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting EndpointSlice %s: %v", name, err)
	}
}

// urls returns the base URLs of ips on port 8000.
func urls(ips ...string) []string {
	var out []string
	for _, ip := range ips {
		if strings.Contains(ip, ":") {
			ip = "[" + ip + "]"
		}
		out = append(out, "http://"+ip+":8000")
	}
	slices.Sort(out)
	return out
}

// logBuffer is a slog handler's output that tests read.
type logBuffer struct{ testutil.SyncBuffer }

// count is how many times s occurs in the log.
func (l *logBuffer) count(s string) int { return strings.Count(l.String(), s) }

// run starts a Watcher over cfg (Client, Namespace and Logger defaulted
// from k) and stops it at the test's end; stop stops it earlier.
func (k *kube) run(t testing.TB, cfg Config) (w *Watcher, logs *logBuffer, stop func()) {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = k.client
	}
	if cfg.Namespace == "" {
		cfg.Namespace = k.ns
	}
	logs = &logBuffer{}
	if cfg.Logger == nil {
		var out io.Writer = logs
		if _, bench := t.(*testing.B); !bench {
			out = io.MultiWriter(logs, testWriter{t})
		}
		cfg.Logger = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return 10 s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return w, logs, stop
}

// testWriter sends log lines to t.Log, so a failing test shows them.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// faults wraps a client's transport to play an API server that is down
// (every request fails) and to cut the watches it carries.
type faults struct {
	rt      http.RoundTripper
	down    atomic.Bool
	refused atomic.Int64
	mu      sync.Mutex
	watches map[*cutBody]bool
}

func newFaults() *faults { return &faults{watches: map[*cutBody]bool{}} }

func (f *faults) wrap(rt http.RoundTripper) http.RoundTripper { f.rt = rt; return f }

func (f *faults) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.down.Load() {
		f.refused.Add(1)
		return nil, fmt.Errorf("injected: dial tcp %s: connect: connection refused", req.URL.Host)
	}
	resp, err := f.rt.RoundTrip(req)
	if err != nil || req.URL.Query().Get("watch") != "true" {
		return resp, err
	}
	b := &cutBody{ReadCloser: resp.Body, f: f}
	f.mu.Lock()
	f.watches[b] = true
	f.mu.Unlock()
	resp.Body = b
	return resp, nil
}

// cut closes every open watch.
func (f *faults) cut() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for b := range f.watches {
		_ = b.ReadCloser.Close()
		delete(f.watches, b)
		n++
	}
	return n
}

func (f *faults) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watches)
}

type cutBody struct {
	io.ReadCloser
	f *faults
}

func (b *cutBody) Close() error {
	b.f.mu.Lock()
	delete(b.f.watches, b)
	b.f.mu.Unlock()
	return b.ReadCloser.Close()
}

// percentile returns the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func diffSets(want, got []string) string { return cmp.Diff(want, got) }
