package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// The graceful drain of real `tandem serve` processes on SIGTERM, as
// Kubernetes stops a pod: readiness fails at once while liveness stays up,
// new requests get a 503 a router retries elsewhere, requests in flight
// finish, a prefill serves the KV it holds until a decode read it, and the
// process exits 0 as soon as nothing is left.

// signal sends sig to p itself (not its group).
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// waitExit waits up to limit for p to exit and returns its exit code.
func (p *proc) waitExit(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("%s still running %v after it was asked to stop", p.name, limit)
	}
	return p.cmd.ProcessState.ExitCode()
}

// probe is the status of GET url, or -1 when nothing answered.
func probe(url string) int {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// expectDraining checks a signalled engine within a second: /health
// (readiness) 503, /livez (liveness) 200, and a new completion an
// OpenAI-shaped 503.
func expectDraining(t *testing.T, e *engine, body map[string]any) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for probe(e.url+"/health") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatalf("%s: /health still answers %d a second after SIGTERM, want 503", e.name, probe(e.url+"/health"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := probe(e.url + "/livez"); got != http.StatusOK {
		t.Errorf("%s: /livez answers %d while draining, want 200 (liveness must not kill a draining pod)", e.name, got)
	}
	r := postJSON(t, e.url+"/v1/completions", body)
	var eb struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if r.status != http.StatusServiceUnavailable || json.Unmarshal(r.body, &eb) != nil || eb.Error.Type != "ServiceUnavailableError" || eb.Error.Code != 503 {
		t.Errorf("%s: a new completion while draining: status %d %s, want an OpenAI-shaped 503 ServiceUnavailableError", e.name, r.status, r.body)
	}
}

// drainLine is the engine's "draining" log line, which counts what was in
// flight when the signal came.
func drainLine(t *testing.T, e *engine) string {
	t.Helper()
	l := findDrainLine(e)
	if l == "" {
		t.Errorf("%s logged no draining line", e.name)
	}
	return l
}

func findDrainLine(e *engine) string {
	for l := range strings.SplitSeq(e.out.String(), "\n") {
		if strings.Contains(l, "msg=\"draining") {
			return l
		}
	}
	return ""
}

// TestPrefillDrainServesHeldKV: proxy → prefill → decode. A prefill leg
// finishes (its KV is held for the decode leg), the prefill gets SIGTERM
// and its 1s --shutdown-timeout passes before the decode leg is sent: the
// prefill must still serve the KV (a drain lasts up to max(timeout, lease)
// for held KV), the router must stop sending it requests, the answer must
// be the colocated engine's, and the prefill must exit 0 right after the
// decode's DONE, not at its 20s lease.
func TestPrefillDrainServesHeldKV(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-lease", "--shutdown-timeout")
	const (
		vocab           = 512
		shutdownTimeout = time.Second
		lease           = 20 * time.Second
	)
	ref := startEngine(t, engineSpec{name: "colocated", model: model})
	prefill := startEngine(t, engineSpec{name: "prefill (drained)", model: model, role: "prefill", env: withSecret,
		args: []string{"--shutdown-timeout", shutdownTimeout.String(), "--kv-lease", lease.String()}})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", env: withSecret,
		args: []string{"--kv-transport", "tcp", "--kv-load-failure-policy", "fail"}})
	proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})

	body := completionBody(tokenPrompt(70001, 60, vocab), samplings[1], false)
	if _, r := generate(t, proxy, "/v1/completions", body); r.pd() != "remote" {
		t.Fatalf("before the drain: x-tandem-pd %q, want remote", r.pd())
	}
	body = completionBody(tokenPrompt(70002, 60, vocab), samplings[1], false)
	want, _ := generate(t, ref.url, "/v1/completions", body)
	params := prefillLeg(t, prefill, body)

	signalled := time.Now()
	prefill.signal(t, syscall.SIGTERM)
	expectDraining(t, prefill, completionBody(tokenPrompt(70003, 20, vocab), samplings[0], false))

	// The proxy's health check sees the 503 and stops sending the prefill
	// requests; until then a prefill leg refused with 503 falls back too.
	// Every answer is a 200.
	deadline := time.Now().Add(3 * time.Second)
	for seed := uint64(70100); ; seed++ {
		_, r := generate(t, proxy, "/v1/completions", completionBody(tokenPrompt(seed, 20, vocab), samplings[0], false))
		if r.pd() == "fallback; reason=no_healthy_prefill" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy still routes to the draining prefill 3s after SIGTERM (x-tandem-pd %q)", r.pd())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Past the prefill's --shutdown-timeout: only the held KV keeps it up.
	time.Sleep(time.Until(signalled.Add(shutdownTimeout + 500*time.Millisecond)))
	if prefill.exited() {
		t.Fatalf("the prefill exited (%v) %v after SIGTERM while it held KV for a decode leg (lease %v)", prefill.err, time.Since(signalled).Round(time.Millisecond), lease)
	}
	leg := clone(body)
	leg["kv_transfer_params"] = params
	got, _ := generate(t, decode.url, "/v1/completions", leg)
	sameGeneration(t, want, got)
	pulled := time.Now()

	if code := prefill.waitExit(t, 5*time.Second); code != 0 {
		t.Errorf("the drained prefill exited with status %d, want 0", code)
	}
	t.Logf("the prefill exited %v after the decode's pull, %v after SIGTERM (lease %v)",
		time.Since(pulled).Round(time.Millisecond), time.Since(signalled).Round(time.Millisecond), lease)
	if d := time.Since(pulled); d > 3*time.Second {
		t.Errorf("the prefill exited %v after the decode read its KV, want promptly (its lease is %v)", d.Round(time.Millisecond), lease)
	}
	if l := drainLine(t, prefill); !strings.Contains(l, "kv_holds=1") || !strings.Contains(l, "max_drain="+lease.String()) {
		t.Errorf("the prefill's draining line should count 1 KV hold and a max_drain of max(--shutdown-timeout, --kv-lease) = %v: %s", lease, l)
	}
	if !strings.Contains(prefill.out.String(), `msg="drained: every request finished`) {
		t.Errorf("the prefill logged no clean drained line")
	}
	if strings.Contains(decode.out.String(), "DONE failed") {
		t.Errorf("the decode's DONE to the draining prefill failed:\n%s", tail(decode.out.String(), 2000))
	}
	waitPoolsIdle(t, decode)
}

// TestDecodeDrainMidStream: long streams run on a decode (one at a time,
// --max-num-seqs 1, so some still queue) when it gets SIGTERM: readiness
// fails, new requests get 503, and every stream, queued ones included,
// completes with all its tokens and [DONE]; the process exits 0.
func TestDecodeDrainMidStream(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--shutdown-timeout")
	const (
		streams   = 4
		maxTokens = 480 // with the 8-token prompt, most of the 512-token context
	)
	decode := startEngine(t, engineSpec{name: "decode (drained mid-stream)", model: model, role: "decode",
		args: []string{"--max-num-seqs", "1", "--shutdown-timeout", "30s"}})
	body := completionBody(tokenPrompt(71001, 8, 512), samplings[1], true)
	body["max_tokens"], body["ignore_eos"], body["logprobs"] = maxTokens, true, 1
	plain := clone(body)
	plain["stream"] = false
	delete(plain, "stream_options")
	want, _ := generate(t, decode.url, "/v1/completions", plain)

	type result struct {
		body []byte
		err  error
	}
	results := make(chan result, streams)
	first := make(chan struct{}, streams)
	b, _ := json.Marshal(body)
	for range streams {
		go func() {
			resp, err := client.Post(decode.url+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				results <- result{err: err}
				return
			}
			defer resp.Body.Close()
			var out bytes.Buffer
			br := bufio.NewReader(resp.Body)
			signalled := false
			for {
				line, err := br.ReadBytes('\n')
				out.Write(line)
				if !signalled && bytes.HasPrefix(line, []byte("data: ")) {
					signalled = true
					first <- struct{}{}
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					results <- result{out.Bytes(), err}
					return
				}
			}
			if resp.StatusCode != 200 {
				results <- result{out.Bytes(), &httpStatusError{resp.StatusCode}}
				return
			}
			results <- result{body: out.Bytes()}
		}()
	}
	select {
	case <-first: // the first stream is under way; the others queue behind it
	case r := <-results:
		t.Fatalf("a stream ended before any sent a token: %v %s", r.err, tail(string(r.body), 500))
	case <-time.After(faultDeadline):
		t.Fatal("no stream sent a token")
	}
	// Every stream must have reached the engine (a request that arrives
	// after the signal is refused, rightly): the one before them finished,
	// the streams run or wait.
	deadline := time.Now().Add(faultDeadline)
	for {
		m := scrape(t, decode.url)
		done, _ := m.get("vllm:request_success_total")
		running, waiting := m.must(t, "vllm:num_requests_running"), m.must(t, "vllm:num_requests_waiting")
		if done+running+waiting >= 1+streams {
			t.Logf("at SIGTERM: %v streams finished, %v running, %v waiting", done-1, running, waiting)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine never saw all %d streams (finished %v, running %v, waiting %v)", streams, done, running, waiting)
		}
		time.Sleep(2 * time.Millisecond)
	}
	signalled := time.Now()
	decode.signal(t, syscall.SIGTERM)
	expectDraining(t, decode, completionBody(tokenPrompt(71002, 8, 512), samplings[0], false))

	for range streams {
		var r result
		select {
		case r = <-results:
		case <-time.After(faultDeadline):
			t.Fatalf("a stream did not complete within %v of SIGTERM", faultDeadline)
		}
		if r.err != nil {
			t.Errorf("a stream in flight at SIGTERM: %v\n%s", r.err, tail(string(r.body), 500))
			continue
		}
		got, err := parseStream(r.body)
		if err != nil {
			t.Errorf("a stream in flight at SIGTERM: %v\n%s", err, tail(string(r.body), 500))
			continue
		}
		if got.CompletionTokens != maxTokens {
			t.Errorf("a stream in flight at SIGTERM ended with %d tokens, want %d", got.CompletionTokens, maxTokens)
		}
		sameGeneration(t, want, got)
	}
	if code := decode.waitExit(t, 5*time.Second); code != 0 {
		t.Errorf("the drained decode exited with status %d, want 0", code)
	}
	t.Logf("the decode exited %v after SIGTERM", time.Since(signalled).Round(time.Millisecond))
	if l := drainLine(t, decode); strings.Contains(l, "requests_in_flight=0 ") {
		t.Errorf("the draining line counts no request in flight, but the streams were: %s", l)
	}
}

type httpStatusError struct{ status int }

func (e *httpStatusError) Error() string { return "status " + http.StatusText(e.status) }

// TestIdleEngineExitsPromptly: an engine with nothing in flight and nothing
// held exits 0 within 2s of SIGTERM, whatever its role; and a second
// signal ends a drain that would wait on held KV at once.
func TestIdleEngineExitsPromptly(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-lease")
	colocated := startEngine(t, engineSpec{name: "colocated (idle)", model: model})
	prefill := startEngine(t, engineSpec{name: "prefill (idle)", model: model, role: "prefill"})
	decode := startEngine(t, engineSpec{name: "decode (idle)", model: model, role: "decode"})
	held := startEngine(t, engineSpec{name: "prefill (holding KV)", model: model, role: "prefill", args: []string{"--kv-lease", "20s"}})
	// One request first, so that an engine that served one also exits at once.
	generate(t, colocated.url, "/v1/completions", completionBody(tokenPrompt(72001, 20, 512), samplings[0], false))
	prefillLeg(t, held, completionBody(tokenPrompt(72002, 20, 512), samplings[0], false))

	for _, e := range []*engine{colocated, prefill, decode, held} {
		e.signal(t, syscall.SIGTERM)
	}
	start := time.Now()
	for _, e := range []*engine{colocated, prefill, decode} {
		if code := e.waitExit(t, 2*time.Second-time.Since(start)); code != 0 {
			t.Errorf("%s exited with status %d, want 0", e.name, code)
		}
	}
	t.Logf("the idle engines exited within %v of SIGTERM", time.Since(start).Round(time.Millisecond))

	if held.exited() {
		t.Fatalf("%s exited (%v) at once on SIGTERM, with KV held for a 20s lease", held.name, held.err)
	}
	// The second signal once the first one was seen (two signals sent
	// before the process ran would be delivered as one).
	testutil.WaitFor(t, held.name+" to log a draining line after SIGTERM", 5*time.Second, func() bool { return findDrainLine(held) != "" })
	held.signal(t, syscall.SIGTERM)
	if code := held.waitExit(t, 2*time.Second); code == 0 {
		t.Errorf("%s exited 0 on a second SIGTERM that dropped its held KV, want a failure status", held.name)
	}
}
