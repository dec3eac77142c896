package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// The transfer contract (docs/kv-transfer.md, "The transfer contract"),
// walked arc by arc on real processes: a simulated prefill and decode
// (`tandem serve --simulate`, real scheduler, KV pool and side channel)
// behind relays the test owns, and a real proxy. Each arc drives one
// request into a phase through a hook (a relay holding a leg, a stopped
// prefill pinning a pull, the decode's --sim-kv-delay window after a pull,
// the first chunk of a stream), injects one fault there, and then checks
// the contract: the request ended with an answer or a clear error (or a
// cut stream where the fault cuts it), within a deadline; every pool on
// every engine is empty within the arc's bound; the cluster serves again.
//
// TANDEM_CONTRACT_LONG=N runs every arc N times; without it, the arcs
// marked short run once (the CI form).

// Phases of one request (the contract's table "Phases and their deadlines").
type contractPhase int

const (
	phPrefill   contractPhase = iota + 1 // P computed and holds the KV; its answer has not reached the proxy
	phBetween                            // the proxy has the params; the decode leg has not reached D
	phPull                               // D has the leg and pulls from P (P is stopped, so the pull cannot end)
	phAfterPull                          // D pulled (P freed), no first token yet (D's --sim-kv-delay)
	phStream                             // the client has the stream's first chunk
)

func (p contractPhase) String() string {
	return [...]string{"", "prefill leg", "between legs", "pull", "after pull", "mid-stream"}[p]
}

// Faults the contract names.
type contractFault int

const (
	fClientGone contractFault = iota + 1
	fPKill
	fPStop
	fDKill
	fDStop
	fPullFailed   // P restarted between the legs: D's pull is refused (peer_restarted)
	fLease        // P's lease expires before the decode leg goes on
	fProxyRestart // the proxy killed and started again
)

func (f contractFault) String() string {
	return [...]string{"", "client gone", "prefill SIGKILL", "prefill SIGSTOP", "decode SIGKILL", "decode SIGSTOP",
		"pull failed", "lease expired", "proxy restarted"}[f]
}

// How a request ended.
type ending int

const (
	endAnswer ending = 1 << iota // 200 with a whole answer (a stream to its [DONE])
	endError                     // an OpenAI-shaped error body
	endCut                       // a stream that started and was cut
	endClosed                    // the connection closed without an answer
	endGone                      // the client itself left
)

func (e ending) String() string {
	var s []string
	for b, n := range map[ending]string{endAnswer: "answer", endError: "error", endCut: "cut stream", endClosed: "closed", endGone: "client gone"} {
		if e&b != 0 {
			s = append(s, n)
		}
	}
	return strings.Join(s, "|")
}

// arc is one row of the contract: a fault in a phase, what the client may
// see, and how soon every pool must be empty. bound is "prompt" unless the
// contract says the hold ends at its lease (lease: true; gap names the
// documented gap when it is one).
type arc struct {
	phase contractPhase
	fault contractFault
	want  ending
	lease bool
	gap   string
	short bool // in the CI form
}

var contractArcs = []arc{
	{phase: phPrefill, fault: fClientGone, want: endGone, short: true},
	{phase: phPrefill, fault: fPKill, want: endAnswer | endError, short: true},
	{phase: phPrefill, fault: fPStop, want: endAnswer | endError, lease: true,
		gap: "a finished forward pass whose answer the proxy gave up on is held until its lease"},
	{phase: phPrefill, fault: fDKill, want: endAnswer | endError},
	{phase: phPrefill, fault: fDStop, want: endAnswer | endError},
	{phase: phPrefill, fault: fLease, want: endAnswer | endError, lease: true},
	{phase: phPrefill, fault: fProxyRestart, want: endClosed, lease: true,
		gap: "a proxy gone after P's forward pass leaves the hold to its lease"},

	{phase: phBetween, fault: fClientGone, want: endGone, short: true},
	{phase: phBetween, fault: fPKill, want: endAnswer | endError},
	{phase: phBetween, fault: fPStop, want: endAnswer | endError},
	{phase: phBetween, fault: fDKill, want: endAnswer | endError, short: true},
	{phase: phBetween, fault: fDStop, want: endAnswer | endError},
	{phase: phBetween, fault: fPullFailed, want: endAnswer | endError, short: true},
	{phase: phBetween, fault: fLease, want: endAnswer | endError, lease: true, short: true},
	{phase: phBetween, fault: fProxyRestart, want: endClosed, lease: true,
		gap: "a proxy crash between the legs leaves P's hold to its lease"},

	{phase: phPull, fault: fClientGone, want: endGone},
	{phase: phPull, fault: fPKill, want: endAnswer | endError, short: true},
	{phase: phPull, fault: fPStop, want: endAnswer | endError},
	{phase: phPull, fault: fDKill, want: endAnswer | endError},
	{phase: phPull, fault: fDStop, want: endAnswer | endError},
	{phase: phPull, fault: fProxyRestart, want: endClosed},

	{phase: phAfterPull, fault: fClientGone, want: endGone},
	{phase: phAfterPull, fault: fPKill, want: endAnswer},
	{phase: phAfterPull, fault: fPStop, want: endAnswer},
	{phase: phAfterPull, fault: fDKill, want: endAnswer | endError, short: true},
	{phase: phAfterPull, fault: fDStop, want: endAnswer | endError},
	{phase: phAfterPull, fault: fProxyRestart, want: endClosed},

	{phase: phStream, fault: fClientGone, want: endGone},
	{phase: phStream, fault: fPKill, want: endAnswer},
	{phase: phStream, fault: fPStop, want: endAnswer},
	{phase: phStream, fault: fDKill, want: endCut, short: true},
	{phase: phStream, fault: fDStop, want: endCut},
	{phase: phStream, fault: fProxyRestart, want: endCut | endClosed, short: true},
}

// Timings of the contract cluster. The lease is long enough that a
// release the contract calls prompt (within promptBound) cannot be the
// lease's; the quick proxy's first-byte deadline is shorter than the
// lease, the patient one's longer, so that a held decode leg outlives the
// lease only through the patient proxy.
const (
	contractLease     = 6 * time.Second
	promptBound       = 3 * time.Second
	leaseBound        = contractLease + 5*time.Second
	quickFirstByte    = 3 * time.Second
	contractStall     = 2 * time.Second
	contractDeadline  = 25 * time.Second // every request of an arc ends within this
	afterPullDelay    = 1500 * time.Millisecond
	contractVocab     = 512
	contractPromptLen = 48 // 3 blocks
)

// contractCluster is one simulated prefill and decode, each behind a
// relay, and two proxies in front of the relays.
type contractCluster struct {
	t              *testing.T // the test whose end stops the processes (restarts included)
	model          string
	p, d           *engine
	pr, dr         *relay
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

func startProxyProc(t *testing.T, name string, port int, args []string) *proxyProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := port
		if p == 0 {
			p = freePort(t)
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
	return startProxyProc(t, pp.name+" (restarted)", pp.port, pp.args)
}

func newContractCluster(t *testing.T) *contractCluster {
	t.Helper()
	c := &contractCluster{t: t, model: testmodels.Stories260K(t), seed: uint64(time.Now().UnixNano())}
	requirePD(t, tandem(t), "--kv-lease", "--simulate", "--sim-kv-delay")
	sim := []string{"--simulate", "--sim-ttft", "5ms", "--sim-itl", "20ms", "--sim-mean-output-len", "0", "--log-level", "info"}
	c.p = startEngine(t, engineSpec{name: "prefill (simulated)", model: c.model, role: "prefill",
		args: append(append([]string{}, sim...), "--kv-lease", contractLease.String())})
	c.d = startEngine(t, engineSpec{name: "decode (simulated)", model: c.model, role: "decode",
		args: append(append([]string{}, sim...), "--kv-load-failure-policy", "recompute", "--sim-kv-delay", afterPullDelay.String())})
	c.pr = startRelay(t, strings.TrimPrefix(c.p.url, "http://"))
	c.dr = startRelay(t, strings.TrimPrefix(c.d.url, "http://"))
	common := []string{"--prefill", c.pr.url(), "--decode", c.dr.url(), "--health-interval", "200ms", "--timeout", "20s",
		"--stall-timeout", contractStall.String()}
	c.quick = startProxyProc(t, "proxy", 0, append(append([]string{}, common...), "--first-byte-timeout", quickFirstByte.String()))
	c.patient = startProxyProc(t, "proxy (patient)", 0, append(append([]string{}, common...), "--first-byte-timeout", "18s"))
	return c
}

// body is a fresh prompt (no prefix cache can answer it) for the cluster.
func (c *contractCluster) body(stream bool, maxTokens int) map[string]any {
	c.seed++
	b := map[string]any{"model": servedName, "prompt": tokenPrompt(c.seed, contractPromptLen, contractVocab),
		"max_tokens": maxTokens, "temperature": 0, "stream": stream}
	return b
}

// outcome is how one request ended.
type outcome struct {
	end    ending
	status int
	detail string
	took   time.Duration
}

// send posts body to url in the background. firstChunk is closed when a
// stream's first data chunk has arrived; the outcome comes on the result.
func send(ctx context.Context, url string, body map[string]any) (firstChunk <-chan struct{}, result <-chan outcome) {
	first := make(chan struct{})
	res := make(chan outcome, 1)
	go func() {
		start := time.Now()
		o := doSend(ctx, url, body, first)
		o.took = time.Since(start)
		if ctx.Err() != nil && o.end != endAnswer {
			o.end, o.detail = endGone, "the client left: "+o.detail
		}
		res <- o
	}()
	return first, res
}

func doSend(ctx context.Context, url string, body map[string]any, first chan struct{}) outcome {
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, contractDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return outcome{end: endClosed, detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{end: endClosed, detail: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		var e struct {
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err == nil && json.Unmarshal(raw, &e) == nil && e.Error != nil && e.Error.Message != "" && e.Error.Type != "" {
			return outcome{end: endError, status: resp.StatusCode, detail: e.Error.Message}
		}
		return outcome{end: endClosed, status: resp.StatusCode, detail: fmt.Sprintf("not an OpenAI-shaped error: %q (%v)", raw, err)}
	}
	if body["stream"] != true {
		raw, err := io.ReadAll(resp.Body)
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err != nil || json.Unmarshal(raw, &r) != nil || len(r.Choices) != 1 || r.Choices[0].FinishReason == "" {
			return outcome{end: endCut, status: 200, detail: fmt.Sprintf("an incomplete answer %q (%v)", tail(string(raw), 200), err)}
		}
		return outcome{end: endAnswer, status: 200, detail: resp.Header.Get("X-Tandem-Pd")}
	}
	sc := bufio.NewScanner(resp.Body)
	chunks, once := 0, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return outcome{end: endAnswer, status: 200, detail: fmt.Sprintf("%s, %d chunks", resp.Header.Get("X-Tandem-Pd"), chunks)}
		}
		if strings.Contains(data, `"error"`) {
			return outcome{end: endCut, status: 200, detail: "an error event after the stream began: " + data}
		}
		chunks++
		if !once {
			once = true
			close(first)
		}
	}
	return outcome{end: endCut, status: 200, detail: fmt.Sprintf("cut after %d chunks (%v)", chunks, sc.Err())}
}

// signal sends sig to e's process group.
func signal(t *testing.T, e *engine, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-e.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("%v to %s: %v", sig, e.name, err)
	}
}

// waitMetric polls e's /metrics until ok(m) or limit.
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

// hasRequest says whether an engine has a request running or waiting.
func hasRequest(m metrics) bool {
	return sumOf(m, "vllm:num_requests_running")+sumOf(m, "vllm:num_requests_waiting") > 0
}

func sumOf(m metrics, name string) float64 {
	v, _ := m.get(name)
	return v
}

// poolsEmpty polls every engine until its pool is empty (no blocks in
// use, none held) and returns how long that took; it fails t after limit.
func poolsEmpty(t *testing.T, limit time.Duration, es ...*engine) time.Duration {
	t.Helper()
	start := time.Now()
	for _, e := range es {
		for {
			m, err := tryScrape(e.url)
			var usage, held float64
			if err == nil {
				usage, held = sumOf(m, "vllm:kv_cache_usage_perc"), sumOf(m, "tandem:kv_blocks_held")
				if usage == 0 && held == 0 {
					break
				}
				err = fmt.Errorf("kv_cache_usage_perc %v, kv_blocks_held %v", usage, held)
			}
			if time.Since(start) > limit {
				t.Errorf("%s: KV pool not empty %v after the request ended: %v", e.name, limit, err)
				return time.Since(start)
			}
			time.Sleep(pollInterval)
		}
	}
	return time.Since(start)
}

// walk runs one arc on c.
func (c *contractCluster) walk(t *testing.T, a arc) {
	proxy := c.quick
	if a.fault == fLease {
		proxy = c.patient
	}
	stream, maxTokens := false, 8
	if a.phase == phStream {
		stream, maxTokens = true, 150 // 3s of tokens at --sim-itl 20ms
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	pStopped, dStopped, pDead, dDead, proxyDead := false, false, false, false, false
	var heldRelay *relay // a relay holding a leg the fault has not decided yet
	switch a.phase {
	case phPrefill:
		c.pr.arm(holdResponse)
		heldRelay = c.pr
	case phBetween, phPull, phAfterPull:
		c.dr.arm(holdRequest)
		heldRelay = c.dr
	}
	first, result := send(ctx, proxy.url(), c.body(stream, maxTokens))
	if heldRelay != nil {
		heldRelay.waitHeld(t, 10*time.Second)
	}
	switch a.phase {
	case phPrefill, phBetween:
		if held := heldBlocks(t, c.p); held == 0 {
			t.Fatalf("phase %v: the prefill holds no blocks", a.phase)
		}
	case phPull:
		signal(t, c.p, syscall.SIGSTOP)
		pStopped = true
		heldRelay.let(true)
		heldRelay = nil
		waitMetric(t, c.d, "the decode leg's request", 10*time.Second, hasRequest)
	case phAfterPull:
		heldRelay.let(true)
		heldRelay = nil
		waitMetric(t, c.p, "the pull's DONE (kv_blocks_held 0)", afterPullDelay, func(m metrics) bool { return sumOf(m, "tandem:kv_blocks_held") == 0 })
		waitMetric(t, c.d, "the decode's request", afterPullDelay, hasRequest)
	case phStream:
		select {
		case <-first:
		case o := <-result:
			t.Fatalf("the stream ended before its first chunk: %v %d %s", o.end, o.status, o.detail)
		case <-time.After(contractDeadline):
			t.Fatalf("no first chunk within %v", contractDeadline)
		}
	}
	t.Logf("in phase %v; injecting %v", a.phase, a.fault)

	// The fault, and what becomes of a leg still held at a relay.
	let := func(forward bool) {
		if heldRelay != nil {
			heldRelay.let(forward)
			heldRelay = nil
		}
	}
	switch a.fault {
	case fClientGone:
		cancel()
		let(true)
	case fPKill:
		c.p.kill(t)
		pDead, pStopped = true, false
		let(a.phase != phPrefill)
	case fPStop:
		if !pStopped {
			signal(t, c.p, syscall.SIGSTOP)
			pStopped = true
		}
		if a.phase != phPrefill { // a stopped P answers nothing more: its held answer stays held
			let(true)
		}
	case fDKill:
		c.d.kill(t)
		dDead, dStopped = true, false
		let(true)
	case fDStop:
		signal(t, c.d, syscall.SIGSTOP)
		dStopped = true
		let(true)
	case fPullFailed:
		c.p = c.p.restart(c.t)
		let(true)
	case fLease:
		before := scrape(t, c.p.url).must(t, "tandem:kv_leases_expired_total")
		waitMetric(t, c.p, "the lease's expiry", leaseBound, func(m metrics) bool {
			v, _ := m.get("tandem:kv_leases_expired_total")
			return v > before
		})
		let(true)
	case fProxyRestart:
		proxy.kill(t)
		proxyDead = true
		let(true)
	}
	if a.phase == phPull && a.fault != fPStop && !pDead {
		signal(t, c.p, syscall.SIGCONT)
		pStopped = false
	}

	var o outcome
	select {
	case o = <-result:
	case <-time.After(contractDeadline + 5*time.Second):
		t.Fatalf("the request did not end within %v of the fault", contractDeadline+5*time.Second)
	}
	let(false) // a leg the fault left held (a stopped prefill's answer): the proxy gave up on it
	end := time.Now()
	if pStopped {
		signal(t, c.p, syscall.SIGCONT)
	}
	if dStopped {
		signal(t, c.d, syscall.SIGCONT)
	}
	if o.end&a.want == 0 {
		t.Errorf("the request ended as %v (status %d: %s) after %v, want %v", o.end, o.status, o.detail, o.took.Round(time.Millisecond), a.want)
	} else {
		t.Logf("the request ended as %v (status %d: %s) after %v", o.end, o.status, o.detail, o.took.Round(time.Millisecond))
	}
	if o.took > contractDeadline {
		t.Errorf("the request took %v, past the %v every request is given", o.took, contractDeadline)
	}

	// Every pool on every engine empty within the arc's bound (killed
	// engines are checked once restarted: their KV died with them).
	if pDead {
		c.p = c.p.restart(c.t)
	}
	if dDead {
		c.d = c.d.restart(c.t)
	}
	if proxyDead {
		c.quick = proxy.restart(c.t)
	}
	bound := promptBound
	if a.lease {
		bound = leaseBound
	}
	poolsEmpty(t, bound-time.Since(end), c.p, c.d)
	t.Logf("pools empty %v after the request ended (bound %v)", time.Since(end).Round(time.Millisecond), bound)
	if a.gap != "" {
		t.Logf("known gap (docs/kv-transfer.md): %s", a.gap)
	}

	// The cluster serves again: a P/D request through the quick proxy.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, res := send(context.Background(), c.quick.url(), c.body(false, 4))
		o := <-res
		if o.end == endAnswer && strings.HasPrefix(o.detail, "remote") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster does not serve P/D 20s after the arc: last %v %d %s", o.end, o.status, o.detail)
		}
		time.Sleep(200 * time.Millisecond)
	}
	poolsEmpty(t, promptBound, c.p, c.d)
}

// TestContract walks the arcs of the transfer contract. The CI form runs
// the arcs marked short once; TANDEM_CONTRACT_LONG=N runs every arc N
// times (docs/kv-transfer.md, "The contract test").
func TestContract(t *testing.T) {
	repeat, long := 1, false
	if v := os.Getenv("TANDEM_CONTRACT_LONG"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TANDEM_CONTRACT_LONG=%q: want a count of repetitions (1 or more)", v)
		}
		repeat, long = n, true
	}
	c := newContractCluster(t)
	arcs := contractArcs
	if long {
		// Each repetition in its own order, so that no arc always follows
		// the same one.
		arcs = nil
		for i := 0; i < repeat; i++ {
			perm := rand.Perm(len(contractArcs))
			for _, j := range perm {
				arcs = append(arcs, contractArcs[j])
			}
		}
	}
	for i, a := range arcs {
		if !long && !a.short {
			continue
		}
		name := fmt.Sprintf("%s in the %s phase", a.fault, a.phase)
		if long {
			name = fmt.Sprintf("%d %s", i, name)
		}
		if !t.Run(name, func(t *testing.T) { c.walk(t, a) }) {
			// A failed arc may leave the cluster in any state: start a
			// fresh one for the next.
			c = newContractCluster(t)
		}
	}
}
