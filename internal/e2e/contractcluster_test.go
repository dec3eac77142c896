package e2e

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// Timings of the contract cluster. The lease is long enough that a
// release the contract calls prompt (within promptBound) cannot be the
// lease's; the quick proxy's first-byte deadline is shorter than the
// lease, the patient one's longer than the lease and than the decode's
// side-channel timeouts (dial 5s, read 10s), so that through it a held
// decode leg outlives the lease and a pull from a stopped prefill fails
// on the decode's own deadline.
const (
	contractLease     = 6 * time.Second
	promptBound       = 3 * time.Second
	leaseBound        = contractLease + 5*time.Second
	quickFirstByte    = 3 * time.Second
	patientFirstByte  = 18 * time.Second
	contractStall     = 2 * time.Second
	contractDeadline  = 25 * time.Second // every request of an arc ends within this
	afterPullDelay    = 1500 * time.Millisecond
	contractVocab     = 512
	contractPromptLen = 48 // 3 blocks
)

// contractCluster is a simulated prefill and two simulated decodes, each
// behind a relay the test owns, and two proxies in front of the relays.
type contractCluster struct {
	t              *testing.T // the test whose end stops the processes (restarts included)
	model          string
	p              *engine
	d              [2]*engine
	pg, dg         *gate // the prefill's relay's gate; the decodes' relays' gate
	dr             [2]*relay
	quick, patient *proxyProc
	seed           uint64
}

// proxyProc is a `tandem proxy` that can be killed and started again on
// its port.
type proxyProc struct {
	*proc
	name string
	port int
	args []string
}

func (pp *proxyProc) url() string { return "http://127.0.0.1:" + strconv.Itoa(pp.port) }

// startProxyProc starts `tandem proxy` on port (0: a free one) with args.
func startProxyProc(t *testing.T, name string, port int, args []string) *proxyProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := port
		if p == 0 {
			p = testutil.FreePort(t)
		}
		pp := &proxyProc{name: name, port: p, args: args}
		pp.proc = startProc(t, name, append([]string{"proxy", "--host", "127.0.0.1", "--port", strconv.Itoa(p)}, args...)...)
		err := waitHealthy(pp.proc, pp.url())
		if err == nil {
			return pp
		}
		if errors.Is(err, errPortClash) && port == 0 && attempt < 3 {
			continue
		}
		t.Fatalf("start %s: %v\n%s", name, err, tail(pp.out.String(), 4000))
	}
}

// restart kills the proxy and starts it again on the same port.
func (pp *proxyProc) restart(t *testing.T) *proxyProc {
	t.Helper()
	pp.kill(t)
	return startProxyProc(t, strings.TrimSuffix(pp.name, " (restarted)")+" (restarted)", pp.port, pp.args)
}

func newContractCluster(t *testing.T) *contractCluster {
	t.Helper()
	c := &contractCluster{t: t, model: testmodels.Stories260K(t), seed: uint64(time.Now().UnixNano())}
	requirePD(t, tandem(t), "--kv-lease", "--simulate", "--sim-kv-delay")
	// 20ms a token, answers run to max_tokens; the decodes' KV delay is
	// the window between a pull and the first token.
	sim := []string{"--simulate", "--sim-ttft", "5ms", "--sim-itl", "20ms", "--sim-mean-output-len", "0", "--log-level", "info"}
	specs := []engineSpec{{name: "prefill (simulated)", model: c.model, role: "prefill",
		args: append(append([]string{}, sim...), "--kv-lease", contractLease.String())}}
	for i := range c.d {
		specs = append(specs, engineSpec{name: fmt.Sprintf("decode %d (simulated)", i), model: c.model, role: "decode",
			args: append(append([]string{}, sim...), "--kv-load-failure-policy", "recompute", "--sim-kv-delay", afterPullDelay.String())})
	}
	es := startEngines(t, specs...)
	c.p, c.d = es[0], [2]*engine{es[1], es[2]}
	c.pg, c.dg = newGate(t), newGate(t)
	pr := startRelay(t, strings.TrimPrefix(c.p.url, "http://"), c.pg)
	var decodes []string
	for i, d := range c.d {
		c.dr[i] = startRelay(t, strings.TrimPrefix(d.url, "http://"), c.dg)
		decodes = append(decodes, c.dr[i].url())
	}
	common := []string{"--prefill", pr.url(), "--decode", strings.Join(decodes, ","), "--health-interval", "200ms",
		"--timeout", "20s", "--stall-timeout", contractStall.String(),
		"--policy", "round-robin", "--pd-decider", "always"} // every request takes the P/D path the arcs walk
	c.quick = startProxyProc(t, "proxy", 0, append(append([]string{}, common...), "--first-byte-timeout", quickFirstByte.String()))
	c.patient = startProxyProc(t, "proxy (patient)", 0, append(append([]string{}, common...), "--first-byte-timeout", patientFirstByte.String()))
	return c
}

// engines is every engine of the cluster.
func (c *contractCluster) engines() []*engine { return []*engine{c.p, c.d[0], c.d[1]} }

// decodeOf is the index of the decode behind relay r.
func (c *contractCluster) decodeOf(r *relay) int {
	if r == c.dr[1] {
		return 1
	}
	return 0
}

// body is a fresh prompt (no prefix cache can answer it) for the cluster.
func (c *contractCluster) body(stream bool, maxTokens int) map[string]any {
	c.seed++
	return map[string]any{"model": servedName, "prompt": tokenPrompt(c.seed, contractPromptLen, contractVocab),
		"max_tokens": maxTokens, "temperature": 0, "stream": stream}
}

// busyDecode is the index of the decode that has a request, within limit.
func (c *contractCluster) busyDecode(t *testing.T, limit time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		for i, d := range c.d {
			if m, err := tryScrape(d.url); err == nil && hasRequest(m) {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decode has a request within %v", limit)
		}
		time.Sleep(pollInterval)
	}
}

// signal sends sig to e's process group.
func signal(t *testing.T, e *engine, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-e.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("%v to %s: %v", sig, e.name, err)
	}
}

// waitMetric polls e's /metrics until ok(m), at most limit.
func waitMetric(t *testing.T, e *engine, what string, limit time.Duration, ok func(metrics) bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		m, err := tryScrape(e.url)
		if err == nil && ok(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not seen within %v (last error %v)", e.name, what, limit, err)
		}
		time.Sleep(pollInterval)
	}
}

// sumOf is the sum of the series of a metric (0 if absent).
func sumOf(m metrics, name string) float64 {
	v, _ := m.get(name)
	return v
}

// hasRequest says whether an engine has a request running or waiting.
func hasRequest(m metrics) bool {
	return sumOf(m, "vllm:num_requests_running")+sumOf(m, "vllm:num_requests_waiting") > 0
}

// poolsEmpty polls every engine until its KV pool is empty (no block in
// use, none held under a lease); it fails t once limit has passed.
func poolsEmpty(t *testing.T, limit time.Duration, es ...*engine) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for _, e := range es {
		for {
			m, err := tryScrape(e.url)
			if err == nil {
				usage, held := sumOf(m, "vllm:kv_cache_usage_perc"), sumOf(m, "tandem:kv_blocks_held")
				if usage == 0 && held == 0 {
					break
				}
				err = fmt.Errorf("kv_cache_usage_perc %v, kv_blocks_held %v", usage, held)
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: KV pool not empty in time: %v", e.name, err)
				return
			}
			time.Sleep(pollInterval)
		}
	}
}
