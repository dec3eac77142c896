package kubediscovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestPlannerScalesTheDeploymentsOnRealTraffic is the chain end to end, as
// `tandem proxy --discovery kubernetes --slo-ttft ... --planner-scale`
// wires it: the Watcher feeds a real proxy the engines of two
// EndpointSlices (simulated engines, two prefill and two decodes, whose
// prefills cost far more than their decode steps), a load of long prompts
// runs through it, the planner fits its model to the scraped engines and
// moves the split toward prefill, and each decision scales the two
// Deployments through the real API server. Its first decisions, held for
// want of samples, keep the split discovery delivered. The same decisions drive a
// second Scaler whose account has no RBAC: it says so once, leaves its
// Deployments alone and only publishes (tandem:planner_desired_replicas
// and tandem:planner_scale_mode on the proxy's /metrics).
func TestPlannerScalesTheDeploymentsOnRealTraffic(t *testing.T) {
	granted, refused := newKube(t), newKube(t)
	ctx := t.Context()
	for _, k := range []*kube{granted, refused} {
		for _, d := range []*appsv1.Deployment{deployment("tandem-prefill", 2), deployment("tandem-decode", 2)} {
			if _, err := k.client.AppsV1().Deployments(k.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rbac, err := os.ReadFile("../../deploy/kubernetes/components/planner-scale/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.ReplaceAll(string(rbac), "name: tandem-router\n", "name: router\n")
	if out, err := granted.cp.Kubectl(ctx, []byte(y), "apply", "-n", granted.ns, "-f", "-"); err != nil {
		t.Fatalf("applying the planner-scale component's RBAC: %v\n%s", err, out)
	}

	// The engines: a prompt token costs 300 µs to prefill, a decode step
	// 1 ms, so prompts of 300 tokens with 4 output tokens are prefill-bound
	// by far, however slow this machine is today (the race detector, other
	// tests beside this one): the planner's best split is 3P:1D.
	to := map[string]string{}
	var ips []string
	for i := range 4 {
		cfg := servertest.SimConfig(t, sim.Knobs{TTFT: time.Millisecond, ITL: time.Millisecond, PrefillPerToken: 300 * time.Microsecond})
		ip := fmt.Sprintf("198.18.1.%d", 1+i)
		to["http://"+ip+":8000"] = "http://" + servertest.Start(t, cfg).Addr()
		ips = append(ips, ip)
	}

	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), nil))
	var scalers atomic.Pointer[[]*Scaler]
	var decisions atomic.Int64
	lowest := atomic.Int64{} // the fewest prefill engines a decision published
	lowest.Store(1 << 20)
	plan := &planner.Config{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond, MinRequests: 10,
		MinDwell: 300 * time.Millisecond, Hysteresis: 0.05,
		MinThreshold: 16, MaxThreshold: 16} // every prompt is prefilled remotely, as PDDecider always does
	p, err := proxy.New(proxy.Config{DynamicBackends: true, PDDecider: "always", Policy: "round-robin",
		Planner: plan, PlanInterval: 200 * time.Millisecond, ScrapeInterval: 100 * time.Millisecond,
		HealthInterval: 100 * time.Millisecond, Timeout: 10 * time.Second, Logger: log,
		// What `tandem proxy --planner-scale` wires (cmd/tandem).
		OnPlan: func(d planner.Decision) {
			decisions.Add(1)
			if int64(d.Prefill) < lowest.Load() {
				lowest.Store(int64(d.Prefill))
			}
			for _, s := range *scalers.Load() {
				if err := s.Scale(ctx, d.Prefill, d.Decode); err != nil {
					log.Warn("planner: scaling the Deployments failed; retried at the next decision", "err", err)
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	var ss []*Scaler
	for i, k := range []*kube{granted, refused} {
		var reg = p.MetricsRegisterer()
		if i == 1 {
			reg = nil // one tandem:planner_scale_mode per registry
		}
		s, err := NewScaler(ScalerConfig{Client: routerClient(t, k), Namespace: k.ns, Prefill: "tandem-prefill", Decode: "tandem-decode",
			Logger: log, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	scalers.Store(&ss)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(pctx, ln) }()
	defer func() { cancel(); <-served }()
	url := "http://" + ln.Addr().String()

	granted.create(t, slice("prefill", "tandem-prefill", nil, ready(ips[0]), ready(ips[1])))
	granted.create(t, slice("decode", "tandem-decode", nil, ready(ips[2]), ready(ips[3])))
	w, _, _ := granted.run(t, Config{Backends: mapped{p, to}, Registerer: p.MetricsRegisterer(), Pools: []Pool{
		{Role: RolePrefill, Selector: ServiceSelector("tandem-prefill")},
		{Role: RoleDecode, Selector: ServiceSelector("tandem-decode")},
	}})
	testutil.WaitFor(t, "the watcher synced and the proxy ready", waitLimit, func() bool { return w.Synced() && p.Ready() })

	// The load: 4 clients of 300-token prompts until the split moved, each
	// pausing between its requests: the proxy measures an engine's prefill
	// cost over windows that end with no prompt between its queue and its
	// first token, which a saturated engine never has.
	var prompt []int
	for i := range 300 {
		prompt = append(prompt, 10+i%490)
	}
	body, _ := json.Marshal(map[string]any{"model": "hf", "prompt": prompt, "max_tokens": 4, "ignore_eos": true})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				select {
				case <-stop:
					return
				case <-time.After(30 * time.Millisecond):
				}
				sent.Add(1)
				resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%d %s", resp.StatusCode, b)
					}
				}
				if err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("a request failed: %v", err)
					}
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	// The granted Deployments follow the planner toward prefill, one
	// engine per change, the total kept.
	for deadline := time.Now().Add(20 * time.Second); granted.replicas(t, "tandem-prefill") < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			resp, err := http.Get(url + proxy.PlanPath)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("the prefill Deployment has %d replicas 20 s into the load, want the planner's 3; its plan (%s):\n%s", granted.replicas(t, "tandem-prefill"), resp.Status, b)
		}
	}
	if pre, dec := granted.replicas(t, "tandem-prefill"), granted.replicas(t, "tandem-decode"); pre+dec != 4 {
		t.Errorf("replicas %d prefill + %d decode: the total moved from 4", pre, dec)
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), sent.Load())
	}
	if n := lowest.Load(); n < 2 {
		t.Errorf("a decision published %d prefill engines, below the 2 discovery delivered: the planner scaled down before it knew the traffic", n)
	}

	var decision struct {
		Decision *planner.Decision `json:"decision"`
	}
	resp, err := http.Get(url + proxy.PlanPath)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&decision)
	resp.Body.Close()
	if err != nil || decision.Decision == nil {
		t.Fatalf("GET %s: %v", proxy.PlanPath, err)
	}
	d := decision.Decision
	if pre := granted.replicas(t, "tandem-prefill"); int(pre) != d.Prefill {
		t.Errorf("the prefill Deployment has %d replicas, the planner's last decision %d", pre, d.Prefill)
	}

	// Without RBAC: said once, nothing scaled, the decision published.
	if !ss[1].Publishing() || ss[0].Publishing() {
		t.Errorf("publishing: granted %v, refused %v; want false and true", ss[0].Publishing(), ss[1].Publishing())
	}
	if n := strings.Count(logs.String(), "not allowed to scale"); n != 1 {
		t.Errorf("the refusal was said %d times, want once", n)
	}
	if pre, dec := refused.replicas(t, "tandem-prefill"), refused.replicas(t, "tandem-decode"); pre != 2 || dec != 2 {
		t.Errorf("without RBAC the Deployments changed to %d + %d", pre, dec)
	}
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf("tandem:planner_desired_replicas{role=\"prefill\"} %d", d.Prefill),
		"tandem:planner_scale_mode{mode=\"scale\"} 1",
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	t.Logf("%d requests, %d decisions; split %dP:%dD (best %dP:%dD, %.1f req/s predicted)", sent.Load(), decisions.Load(), d.Prefill, d.Decode, d.Best.P, d.Best.D, d.Best.Goodput)
}
