package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The transfer contract (docs/kv-transfer.md, "The transfer contract"),
// walked arc by arc on real processes: a simulated prefill and two
// simulated decodes (`tandem serve --simulate`: the real scheduler, KV
// pool, side channel and connector) behind relays the test owns, and a
// real proxy. Each arc drives one request into a phase through a hook (a
// relay holding a leg, a stopped prefill pinning a pull, the decode's
// --sim-kv-delay window after a pull, a stream's first chunk), injects one
// fault there, and checks the contract: the request ended, within its
// deadline, with an answer or a clear error (or a cut stream, or a closed
// connection, where the fault cuts it); every pool on every engine is
// empty within the arc's bound; the cluster serves P/D again.
//
// TANDEM_CONTRACT_LONG=N runs every arc N times, shuffled; without it, the
// arcs marked short run once (the CI form).

// Phases of one request (the contract's table "Phases and their deadlines").
type contractPhase int

const (
	phPrefill   contractPhase = iota + 1 // P computed and holds the KV; its answer has not reached the proxy
	phBetween                            // the proxy has the params; the decode leg has not reached D
	phPull                               // D has the leg and pulls from P, which is stopped: the pull cannot end
	phAfterPull                          // D pulled (P freed), no first token yet (D's --sim-kv-delay)
	phStream                             // the client has the stream's first chunk
)

func (p contractPhase) String() string {
	return [...]string{"", "prefill leg", "between legs", "pull", "after pull", "mid-stream"}[p]
}

// Faults the contract names.
type contractFault int

const (
	fClientGone     contractFault = iota + 1
	fClientGoneLate               // the client gone, and the prefill's answer later than the proxy's grace for it
	fPKill
	fPStop
	fDKill
	fDStop
	fPullFailed   // P restarted between the legs: D's pull is refused (peer_restarted)
	fLease        // P's lease expires before the decode leg goes on
	fProxyRestart // the proxy killed and started again on its port
)

func (f contractFault) String() string {
	return [...]string{"", "client gone", "client gone past the grace", "prefill SIGKILL", "prefill SIGSTOP", "decode SIGKILL", "decode SIGSTOP",
		"pull failed", "lease expired", "proxy restarted"}[f]
}

// arc is one row of the contract: a fault in a phase, how the request may
// end (and, for an answer, how the proxy says it was served), and how soon
// every pool must be empty: promptly unless the contract leaves the hold
// to its lease (lease; gap quotes the documented gap).
type arc struct {
	phase   contractPhase
	fault   contractFault
	want    ending
	pd      string // x-tandem-pd of an answer, when the arc decides it
	lease   bool
	gap     string
	patient bool // through the proxy whose first-byte deadline outlasts the lease and the decode's side-channel timeouts
	short   bool // in the CI form
}

const (
	pdRemote      = "remote"
	pdDecodeRetry = "fallback; reason=decode_retry"
)

var contractArcs = []arc{
	{phase: phPrefill, fault: fClientGone, want: endGone, short: true},
	{phase: phPrefill, fault: fClientGoneLate, want: endGone, lease: true,
		// An engine releases an answer it could not deliver, but here the
		// relay took it (as a TCP peer's buffer can): the hold waits.
		gap: "a prefill forward pass that ends after its client left and after the grace holds its KV until the lease when its answer was written into a connection nobody reads"},
	{phase: phPrefill, fault: fPKill, want: endAnswer, pd: "fallback; reason=prefill_unreachable", short: true},
	{phase: phPrefill, fault: fPStop, want: endAnswer, pd: "fallback; reason=prefill_timeout", lease: true,
		gap: "a prefill forward pass that ends after the proxy gave up on its leg holds its KV until the lease"},
	{phase: phPrefill, fault: fDKill, want: endAnswer},
	{phase: phPrefill, fault: fDStop, want: endAnswer},
	{phase: phPrefill, fault: fLease, want: endAnswer, lease: true, patient: true},
	{phase: phPrefill, fault: fProxyRestart, want: endClosed, lease: true,
		gap: "a proxy gone after P's forward pass leaves the hold to its lease"},

	{phase: phBetween, fault: fClientGone, want: endGone, short: true},
	{phase: phBetween, fault: fPKill, want: endAnswer, pd: pdRemote},
	{phase: phBetween, fault: fPStop, want: endAnswer, pd: pdRemote, patient: true},
	{phase: phBetween, fault: fDKill, want: endAnswer, pd: pdDecodeRetry, short: true},
	{phase: phBetween, fault: fDStop, want: endAnswer, pd: pdDecodeRetry},
	{phase: phBetween, fault: fPullFailed, want: endAnswer, pd: pdRemote, short: true},
	{phase: phBetween, fault: fLease, want: endAnswer, pd: pdRemote, lease: true, patient: true, short: true},
	{phase: phBetween, fault: fProxyRestart, want: endClosed, lease: true,
		gap: "a proxy crash between the legs leaves P's hold to its lease"},

	{phase: phPull, fault: fClientGone, want: endGone},
	{phase: phPull, fault: fPKill, want: endAnswer, pd: pdRemote},
	{phase: phPull, fault: fPStop, want: endAnswer, pd: pdRemote, patient: true},
	{phase: phPull, fault: fDKill, want: endAnswer, pd: pdDecodeRetry},
	{phase: phPull, fault: fDStop, want: endAnswer, pd: pdDecodeRetry},
	{phase: phPull, fault: fProxyRestart, want: endClosed},

	{phase: phAfterPull, fault: fClientGone, want: endGone},
	{phase: phAfterPull, fault: fPKill, want: endAnswer, pd: pdRemote},
	{phase: phAfterPull, fault: fPStop, want: endAnswer, pd: pdRemote, short: true},
	{phase: phAfterPull, fault: fDKill, want: endAnswer, pd: pdDecodeRetry, short: true},
	{phase: phAfterPull, fault: fDStop, want: endAnswer, pd: pdDecodeRetry},
	{phase: phAfterPull, fault: fProxyRestart, want: endClosed},

	{phase: phStream, fault: fClientGone, want: endGone},
	{phase: phStream, fault: fPKill, want: endAnswer, pd: pdRemote},
	{phase: phStream, fault: fPStop, want: endAnswer, pd: pdRemote},
	{phase: phStream, fault: fDKill, want: endCut, short: true},
	{phase: phStream, fault: fDStop, want: endCut, short: true},
	{phase: phStream, fault: fProxyRestart, want: endCut | endClosed, short: true},
}

// walk runs one arc on c.
func (c *contractCluster) walk(t *testing.T, a arc) {
	proxy := c.quick
	if a.patient {
		proxy = c.patient
	}
	// A non-streamed answer's first-byte deadline is the proxy's plus 1s
	// per max_tokens: few tokens keep it short.
	stream, maxTokens := false, 4
	if a.phase == phStream {
		stream, maxTokens = true, 150 // 3s of tokens at --sim-itl 20ms
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var held *gate // a gate holding a leg the fault has not decided yet
	switch a.phase {
	case phPrefill:
		held = c.pg
		held.arm(holdResponse)
	case phBetween, phPull, phAfterPull:
		held = c.dg
		held.arm(holdRequest)
	}
	first, result := send(ctx, proxy.url(), c.body(stream, maxTokens))
	di := 0 // the decode a decode fault hits: the one with the request once it has one
	if held != nil {
		r := held.waitHeld(t, 10*time.Second)
		if held == c.dg {
			di = c.decodeOf(r)
		}
	}
	pStopped, dStopped := false, false
	switch a.phase {
	case phPrefill, phBetween:
		if heldBlocks(t, c.p) == 0 {
			t.Fatalf("phase %v: the prefill holds no blocks", a.phase)
		}
	case phPull:
		signal(t, c.p, syscall.SIGSTOP)
		pStopped = true
		held.let(true)
		held = nil
		waitMetric(t, c.d[di], "a KV fetch in progress", 10*time.Second, func(m metrics) bool {
			v, _ := m.get("vllm:num_requests_kv_fetch_by_stage", `stage="in_progress"`)
			return v > 0
		})
	case phAfterPull:
		held.let(true)
		held = nil
		waitMetric(t, c.p, "the pull's DONE (kv_blocks_held 0)", 5*time.Second, func(m metrics) bool { return sumOf(m, "tandem:kv_blocks_held") == 0 })
		// Still inside D's KV delay: the request has no token yet.
		waitMetric(t, c.d[di], "the decode's request", afterPullDelay, hasRequest)
	case phStream:
		select {
		case <-first:
		case o := <-result:
			t.Fatalf("the stream ended before its first chunk: %v %d %s", o.end, o.status, o.detail)
		case <-time.After(contractDeadline):
			t.Fatalf("no first chunk within %v", contractDeadline)
		}
		di = c.busyDecode(t, time.Second)
	}
	t.Logf("in phase %v (decode %d); injecting %v", a.phase, di, a.fault)

	// The fault, and what becomes of a leg still held: it goes on, unless
	// its engine can no longer answer it.
	let := func(forward bool) {
		if held != nil {
			held.let(forward)
			held = nil
		}
	}
	pDead, dDead, proxyDead := false, false, false
	switch a.fault {
	case fClientGone:
		cancel()
		if held == c.dg {
			// The proxy closes the decode leg it holds at once (the
			// prefill leg it keeps for its grace).
			held.waitGone(t, 5*time.Second)
		}
		let(true)
	case fClientGoneLate:
		cancel()
		held.waitGone(t, 10*time.Second) // the grace (2s) has passed: the proxy cancelled the leg
		let(true)
	case fPKill:
		c.p.kill(t)
		pDead, pStopped = true, false
		let(a.phase != phPrefill) // a killed P's answer never comes
	case fPStop:
		if !pStopped {
			signal(t, c.p, syscall.SIGSTOP)
			pStopped = true
		}
		if a.phase != phPrefill { // a stopped P's answer stays held until the proxy gives up
			let(true)
		}
	case fDKill:
		c.d[di].kill(t)
		dDead = true
		let(true)
	case fDStop:
		signal(t, c.d[di], syscall.SIGSTOP)
		dStopped = true
		let(true)
	case fPullFailed:
		c.p = c.p.restart(c.t)
		let(true)
	case fLease:
		before := scrape(t, c.p.url).must(t, "tandem:kv_leases_expired_total")
		waitMetric(t, c.p, "the lease's expiry", leaseBound, func(m metrics) bool { return sumOf(m, "tandem:kv_leases_expired_total") > before })
		let(true)
	case fProxyRestart:
		proxy.kill(t)
		proxyDead = true
		let(true) // the relay drops a leg whose proxy is gone
	}
	if a.phase == phPull && a.fault != fPStop && pStopped {
		signal(t, c.p, syscall.SIGCONT) // the pull goes on, or finds its request gone
		pStopped = false
	}

	var o outcome
	select {
	case o = <-result:
	case <-time.After(contractDeadline + 5*time.Second):
		t.Fatalf("the request did not end within %v of the fault", contractDeadline+5*time.Second)
	}
	let(false) // a stopped P's answer: the proxy gave up on it
	end := time.Now()
	if pStopped {
		signal(t, c.p, syscall.SIGCONT)
	}
	if dStopped {
		signal(t, c.d[di], syscall.SIGCONT)
	}
	switch {
	case o.end&a.want == 0:
		t.Errorf("the request ended as %v (status %d, x-tandem-pd %q: %s) after %v, want %v",
			o.end, o.status, o.pd, o.detail, o.took.Round(time.Millisecond), a.want)
	case o.end == endAnswer && a.pd != "" && o.pd != a.pd:
		t.Errorf("answered with x-tandem-pd %q after %v, want %q", o.pd, o.took.Round(time.Millisecond), a.pd)
	default:
		t.Logf("the request ended as %v (status %d, x-tandem-pd %q: %s) after %v", o.end, o.status, o.pd, o.detail, o.took.Round(time.Millisecond))
	}

	// Killed processes start again on their ports (their KV died with
	// them); then every pool on every engine must be empty in time.
	if pDead {
		c.p = c.p.restart(c.t)
	}
	if dDead {
		c.d[di] = c.d[di].restart(c.t)
	}
	if proxyDead {
		c.quick = proxy.restart(c.t)
	}
	bound := promptBound
	if a.lease {
		bound = leaseBound
	}
	poolsEmpty(t, bound-time.Since(end), c.engines()...)
	t.Logf("pools empty %v after the request ended (bound %v)", time.Since(end).Round(time.Millisecond), bound)
	if a.gap != "" {
		t.Logf("known gap (docs/kv-transfer.md): %s", a.gap)
	}

	// The cluster serves P/D again (a decode ejected after the fault has
	// passed a health check again by then).
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, res := send(context.Background(), c.quick.url(), c.body(false, 2))
		o := <-res
		if o.end == endAnswer && o.pd == pdRemote {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster does not serve P/D 20s after the arc: last %v %d %q %s", o.end, o.status, o.pd, o.detail)
		}
		time.Sleep(200 * time.Millisecond)
	}
	poolsEmpty(t, promptBound, c.engines()...)
}

// TestContract walks the arcs of the transfer contract (docs/kv-transfer.md,
// "The contract test"). The CI form runs the arcs marked short once;
// TANDEM_CONTRACT_LONG=N runs every arc N times, each round shuffled.
func TestContract(t *testing.T) {
	rounds, long := 1, false
	if v := os.Getenv("TANDEM_CONTRACT_LONG"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TANDEM_CONTRACT_LONG=%q: want a number of rounds (1 or more)", v)
		}
		rounds, long = n, true
	}
	var arcs []arc
	for _, a := range contractArcs {
		if long || a.short {
			arcs = append(arcs, a)
		}
	}
	if long {
		one := arcs
		arcs = nil
		for range rounds {
			for _, j := range rand.Perm(len(one)) {
				arcs = append(arcs, one[j])
			}
		}
	}
	c := newContractCluster(t)
	for i, a := range arcs {
		name := fmt.Sprintf("%s in the %s phase", a.fault, a.phase)
		if long {
			name = fmt.Sprintf("%03d %s", i, name)
		}
		if !t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) { c.walk(t, a) }) {
			// A failed arc may leave any state behind: the next starts
			// on a fresh cluster.
			c = newContractCluster(t)
		}
	}
}
