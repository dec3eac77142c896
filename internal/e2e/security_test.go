package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// The cluster secret of these tests' engines. It reaches each engine in its
// own environment (engineSpec.env), never the test process's.
const clusterSecret = "e2e-cluster-secret-0123456789abcdef"

var (
	withSecret = []string{kvxfer.SecretEnv + "=" + clusterSecret}
	noSecret   = []string{kvxfer.SecretEnv + "="}
)

// countingListener is a TCP listener the test owns: it accepts and closes
// every connection and counts them. A decode engine that dials it has been
// made to connect somewhere a client chose.
type countingListener struct {
	ln   net.Listener
	n    atomic.Int64
	port int
}

func listenCounting(t *testing.T) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return l
}

func (l *countingListener) addr() string { return l.ln.Addr().String() }

// expectNoDial fails t if l accepted any connection.
func (l *countingListener) expectNoDial(t *testing.T) {
	t.Helper()
	if n := l.n.Load(); n != 0 {
		t.Errorf("the listener at %s accepted %d connection(s): a decode engine dialed an address a client wrote", l.addr(), n)
	}
}

// leakWords are what an error to a client must not say: the outcome of a
// dial, which would make the engine a port scanner's oracle.
var leakWords = []string{"refused", "timeout", "timed out", "i/o", "no route", "unreachable", "reset by peer", "eof", "bad magic"}

// checkRefusal fails t unless r is a 4xx with an OpenAI-shaped error body
// that names neither the address in the params nor what a dial found.
func checkRefusal(t *testing.T, r reply, addrs ...string) {
	t.Helper()
	if r.status < 400 || r.status > 499 {
		t.Errorf("status %d, want 4xx: %s", r.status, r.body)
	}
	checkErrorBody(t, r, addrs...)
}

// checkErrorBody fails t unless r's body is {"error": {"message", "type",
// ...}} and says nothing about addrs or a dial's outcome.
func checkErrorBody(t *testing.T, r reply, addrs ...string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body is not OpenAI-shaped ({\"error\": {\"message\", \"type\", ...}}): %s", r.body)
	}
	lower := strings.ToLower(string(r.body))
	for _, a := range addrs {
		if strings.Contains(lower, strings.ToLower(a)) {
			t.Errorf("error body names %q: %s", a, r.body)
		}
	}
	for _, w := range leakWords {
		if strings.Contains(lower, w) {
			t.Errorf("error body says %q, which tells the client what a dial found: %s", w, r.body)
		}
	}
}

// prefillLeg sends body to a prefill engine as the proxy's first leg and
// returns the kv_transfer_params it answered.
func prefillLeg(t *testing.T, prefill *engine, body map[string]any) map[string]any {
	t.Helper()
	leg := clone(body)
	leg["max_tokens"] = 1
	leg["stream"] = false
	delete(leg, "stream_options")
	leg["kv_transfer_params"] = map[string]any{"do_remote_decode": true}
	r := postJSON(t, prefill.url+"/v1/completions", leg)
	var pr struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &pr) != nil || pr.KVTransferParams == nil {
		t.Fatalf("prefill leg: status %d, want 200 with kv_transfer_params: %s", r.status, r.body)
	}
	return pr.KVTransferParams
}

// clone copies a request body (one level deep: callers replace fields,
// they do not edit nested values).
func clone(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	maps.Copy(c, m)
	return c
}

// forgedParams are kv_transfer_params a client wrote itself, naming
// host:port as the prefill and blocks for an n-token prompt.
func forgedParams(host string, port, n int) map[string]any {
	ids := make([]int, (n+blockSize-1)/blockSize)
	for i := range ids {
		ids[i] = i + 1
	}
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_engine_id": "forged-engine", "remote_request_id": "forged-request",
		"remote_host": host, "remote_port": port,
		"remote_block_ids": [][]int{ids}, "remote_num_tokens": n, "tp_size": 1,
	}
}

// signParams re-signs params as a prefill engine of this cluster would
// (the test knows the secret) for the prompt of body, valid until expiry.
func signParams(t *testing.T, params, body map[string]any, expiry time.Time) map[string]any {
	t.Helper()
	s, err := kvxfer.NewSecret([]byte(clusterSecret))
	if err != nil {
		t.Fatal(err)
	}
	digest := promptDigestOf(t, body)
	ids := params["remote_block_ids"].([][]int)[0]
	g := kvxfer.Grant{
		EngineID: params["remote_engine_id"].(string), RequestID: params["remote_request_id"].(string),
		Host: params["remote_host"].(string), Port: params["remote_port"].(int),
		BlockIDs: ids, NumTokens: params["remote_num_tokens"].(int), Digest: digest,
	}
	out := clone(params)
	out[kvxfer.SignatureParam] = kvxfer.NewSigner(s).Sign(g, expiry)
	out["tandem_prompt_digest"] = digest
	return out
}

// promptDigestOf is the tandem_prompt_digest of body's prompt (token ids),
// which anyone who knows the model can compute.
func promptDigestOf(t *testing.T, body map[string]any) string {
	t.Helper()
	var prompt []int32
	for _, id := range body["prompt"].([]int) {
		prompt = append(prompt, int32(id))
	}
	return kvparams.PromptDigest(storiesFingerprint(t), prompt)
}

var fingerprint struct {
	once sync.Once
	fp   string
	err  error
}

// storiesFingerprint is the model fingerprint of the engines' stories260K,
// which a prompt digest is keyed by.
func storiesFingerprint(t *testing.T) string {
	t.Helper()
	dir := testmodels.Stories260K(t)
	fingerprint.once.Do(func() {
		m, err := model.Load(dir, tensor.NewPool(1))
		if err != nil {
			fingerprint.err = err
			return
		}
		fingerprint.fp = m.Fingerprint()
	})
	if fingerprint.err != nil {
		t.Fatal(fingerprint.err)
	}
	return fingerprint.fp
}

// fixed is params that do not depend on the request's body.
func fixed(p map[string]any) func(map[string]any) map[string]any {
	return func(map[string]any) map[string]any { return p }
}

// refusals counts the decode's log lines saying it refused params before
// dialing.
func refusals(e *engine) int {
	return strings.Count(e.out.String(), "refused kv_transfer_params before dialing")
}

// expectRefusalLogged waits (the log reaches the test through a pipe) for
// e's log to have more refusal lines than before.
func expectRefusalLogged(t *testing.T, e *engine, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for refusals(e) <= before {
		if time.Now().After(deadline) {
			t.Errorf("%s's log has no new \"refused kv_transfer_params before dialing\" line", e.name)
			return
		}
		time.Sleep(pollInterval)
	}
}

// TestForgedKVParamsNeverMakeADecodeDial sends kv_transfer_params a client
// wrote, or a real prefill's params altered, to real decode engines
// (directly and through the proxy on its remote and fallback paths). They
// point at a listener the test owns: it must see no connection, the client
// must get a 4xx (or, through the proxy, a normal answer: the proxy drops
// client params) that says nothing about the address, and the decode must
// allocate nothing.
func TestForgedKVParamsNeverMakeADecodeDial(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-peers")
	const vocab = 512

	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill", env: withSecret})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", env: withSecret,
		args: []string{"--kv-load-failure-policy", "fail"}})
	open := startEngine(t, engineSpec{name: "decode without a secret", model: model, role: "decode", env: noSecret})
	narrow := startEngine(t, engineSpec{name: "decode without a secret, --kv-peers 10.0.0.0/8", model: model, role: "decode",
		env: noSecret, args: []string{"--kv-peers", "10.0.0.0/8"}})
	ln := listenCounting(t)

	seed := uint64(20000)
	fresh := func() map[string]any {
		seed++
		return completionBody(tokenPrompt(seed, 40, vocab), samplings[0], false)
	}
	// refused sends body with params to e and checks the refusal: fast (no
	// dial timeout), 4xx, generic, logged, and no connection to ln.
	// The params carry the prompt's digest (a client can compute it), so
	// that only the check under test refuses them.
	refused := func(t *testing.T, e *engine, params func(body map[string]any) map[string]any, addrs ...string) {
		t.Helper()
		body := fresh()
		kv := clone(params(body))
		if _, ok := kv["tandem_prompt_digest"]; !ok {
			kv["tandem_prompt_digest"] = promptDigestOf(t, body)
		}
		body["kv_transfer_params"] = kv
		before, logged := failures(t, e), refusals(e)
		start := time.Now()
		r := postJSON(t, e.url+"/v1/completions", body)
		// A refusal needs no network; 2s is far below the 5s dial timeout
		// a dial to an unrouted address would take.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the refusal took %v: did the decode dial first?", d.Round(time.Millisecond))
		}
		checkRefusal(t, r, append(addrs, ln.addr(), strconv.Itoa(ln.port))...)
		t.Logf("status %d: %s", r.status, errorMessage(r.body))
		expectRefusalLogged(t, e, logged)
		if after := failures(t, e); after != before {
			t.Errorf("tandem:kv_transfer_failures_total went from %v to %v: a pull was attempted", before, after)
		}
		ln.expectNoDial(t)
	}

	t.Run("a decode with a secret refuses params", func(t *testing.T) {
		n := 40
		t.Run("a client wrote, unsigned, naming the test's listener", func(t *testing.T) {
			refused(t, decode, fixed(forgedParams("127.0.0.1", ln.port, n)))
		})
		t.Run("a client wrote, unsigned, naming an unrouted address", func(t *testing.T) {
			refused(t, decode, fixed(forgedParams("192.0.2.1", 5600, n)), "192.0.2.1")
		})
		t.Run("with a made-up signature", func(t *testing.T) {
			p := forgedParams("127.0.0.1", ln.port, n)
			p[kvxfer.SignatureParam] = "v1." + strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10) + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
			refused(t, decode, fixed(p))
		})
		t.Run("signed with the cluster's secret but expired", func(t *testing.T) {
			// Genuine params past their expiry are a timing fault, not a
			// forgery: the load fails at once, before any dial, and the
			// load-failure policy answers (this decode's is "fail": a 500
			// that says the params expired, naming no address).
			body := fresh()
			kv := clone(signParams(t, forgedParams("127.0.0.1", ln.port, n), body, time.Now().Add(-2*time.Minute)))
			if _, ok := kv["tandem_prompt_digest"]; !ok {
				kv["tandem_prompt_digest"] = promptDigestOf(t, body)
			}
			body["kv_transfer_params"] = kv
			start := time.Now()
			r := postJSON(t, decode.url+"/v1/completions", body)
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the answer took %v: did the decode dial first?", d.Round(time.Millisecond))
			}
			if r.status != http.StatusInternalServerError || !strings.Contains(errorMessage(r.body), "expired") {
				t.Errorf("status %d, want 500 saying the params expired: %s", r.status, r.body)
			}
			checkErrorBody(t, r, "127.0.0.1:"+strconv.Itoa(ln.port), strconv.Itoa(ln.port))
			ln.expectNoDial(t)
		})

		// A real prefill's params, altered one field at a time. Each
		// alteration is sent with the prompt the prefill signed for.
		body := fresh()
		real := prefillLeg(t, prefill, body)
		if _, ok := real[kvxfer.SignatureParam].(string); !ok {
			t.Fatalf("the prefill's params carry no %s: %v", kvxfer.SignatureParam, real)
		}
		tamper := []struct {
			name string
			edit func(p map[string]any)
		}{
			{"a block id", func(p map[string]any) {
				ids := p["remote_block_ids"].([]any)[0].([]any)
				alt := append([]any(nil), ids...)
				alt[0] = ids[0].(float64) + 1
				p["remote_block_ids"] = []any{alt}
			}},
			{"the engine id", func(p map[string]any) { p["remote_engine_id"] = "another-engine" }},
			{"the request id", func(p map[string]any) { p["remote_request_id"] = "another-request" }},
			{"the host and port, pointed at the listener", func(p map[string]any) {
				p["remote_host"], p["remote_port"] = "127.0.0.1", ln.port
			}},
			{"the port alone, pointed at the listener", func(p map[string]any) { p["remote_port"] = ln.port }},
			{"the expiry inside the signature", func(p map[string]any) {
				parts := strings.SplitN(p[kvxfer.SignatureParam].(string), ".", 3)
				ms, _ := strconv.ParseInt(parts[1], 10, 64)
				parts[1] = strconv.FormatInt(ms+3600_000, 10)
				p[kvxfer.SignatureParam] = strings.Join(parts, ".")
			}},
			{"no signature at all", func(p map[string]any) { delete(p, kvxfer.SignatureParam) }},
		}
		for _, tc := range tamper {
			t.Run("a real prefill's params with "+tc.name+" altered", func(t *testing.T) {
				p := clone(real)
				tc.edit(p)
				b := clone(body)
				b["kv_transfer_params"] = p
				logged := refusals(decode)
				r := postJSON(t, decode.url+"/v1/completions", b)
				checkRefusal(t, r, ln.addr(), strconv.Itoa(ln.port))
				expectRefusalLogged(t, decode, logged)
				ln.expectNoDial(t)
			})
		}
		t.Run("and still accepts the real params unaltered", func(t *testing.T) {
			b := clone(body)
			b["kv_transfer_params"] = real
			before := decodeCounters(t, decode)
			r := postJSON(t, decode.url+"/v1/completions", b)
			if r.status != 200 {
				t.Fatalf("status %d, want 200: %s", r.status, r.body)
			}
			g, err := parseResponse(r.body)
			if err != nil {
				t.Fatal(err)
			}
			checkPulled(t, decodeCounters(t, decode).sub(before), g.PromptTokens, 0)
		})
		// The prefix-cache poisoning attack: the real params with another
		// prompt of the same length would make the decode file the
		// prefill's KV under that prompt's block hashes.
		t.Run("and refuses the real params sent with another prompt of the same length", func(t *testing.T) {
			b := fresh()
			b["kv_transfer_params"] = real
			logged := refusals(decode)
			r := postJSON(t, decode.url+"/v1/completions", b)
			checkRefusal(t, r, ln.addr(), strconv.Itoa(ln.port))
			if !strings.Contains(errorMessage(r.body), "issued for another prompt") {
				t.Errorf("the refusal does not say the params were issued for another prompt: %s", r.body)
			}
			expectRefusalLogged(t, decode, logged)
		})
	})

	t.Run("a decode without a secret refuses peers outside --kv-peers", func(t *testing.T) {
		t.Run("an unrouted address, default allowlist (loopback)", func(t *testing.T) {
			refused(t, open, fixed(forgedParams("192.0.2.1", 5600, 40)), "192.0.2.1")
		})
		t.Run("another unrouted address, default allowlist", func(t *testing.T) {
			refused(t, open, fixed(forgedParams("10.255.255.1", 5600, 40)), "10.255.255.1")
		})
		t.Run("a host name, default allowlist", func(t *testing.T) {
			refused(t, open, fixed(forgedParams("example.com", 5600, 40)), "example.com")
		})
		t.Run("the test's loopback listener, --kv-peers 10.0.0.0/8", func(t *testing.T) {
			refused(t, narrow, fixed(forgedParams("127.0.0.1", ln.port, 40)))
		})
		t.Run("localhost by name, --kv-peers 10.0.0.0/8", func(t *testing.T) {
			refused(t, narrow, fixed(forgedParams("localhost", ln.port, 40)))
		})
		t.Run("an unrouted address, --kv-peers 10.0.0.0/8", func(t *testing.T) {
			refused(t, narrow, fixed(forgedParams("192.0.2.1", 5600, 40)), "192.0.2.1")
		})
	})

	// The proxy must drop whatever kv_transfer_params a client sends, on
	// both paths. Params signed with the cluster's secret (as if a client
	// had stolen it, or replayed a prefill's answer) would make the decode
	// dial the listener if the proxy forwarded them, so zero connections
	// shows the proxy dropped them; unsigned ones would make the decode
	// refuse the request.
	proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})
	// The fallback proxy's prefill is killed once the proxy is up (a proxy
	// with no live prefill at start is not healthy).
	doomed := startEngine(t, engineSpec{name: "prefill (killed)", model: model, role: "prefill", env: withSecret})
	fallback := startProxy(t, "proxy with its prefill killed", []*engine{doomed}, []*engine{decode})
	doomed.kill(t)
	clientParams := []struct {
		name   string
		params func(body map[string]any) map[string]any
	}{
		{"unsigned params", fixed(forgedParams("127.0.0.1", ln.port, 40))},
		{"validly signed params", func(body map[string]any) map[string]any {
			return signParams(t, forgedParams("127.0.0.1", ln.port, 40), body, time.Now().Add(time.Minute))
		}},
		{"a do_remote_decode request", func(map[string]any) map[string]any {
			return map[string]any{"do_remote_decode": true, "remote_host": "127.0.0.1", "remote_port": ln.port}
		}},
	}
	for _, path := range []struct {
		name, url, pd string
	}{{"remote", proxy, "remote"}, {"fallback", fallback, "fallback"}} {
		for _, cp := range clientParams {
			t.Run("the proxy on its "+path.name+" path drops a client's "+cp.name, func(t *testing.T) {
				body := fresh()
				body["kv_transfer_params"] = cp.params(body)
				r := postJSON(t, path.url+"/v1/completions", body)
				if r.status != 200 {
					t.Errorf("status %d (x-tandem-pd %q), want 200: %s", r.status, r.pd(), r.body)
				}
				if !strings.HasPrefix(r.pd(), path.pd) {
					t.Errorf("x-tandem-pd %q, want %s", r.pd(), path.pd)
				}
				if bytes.Contains(r.body, []byte("forged-engine")) {
					t.Errorf("the answer echoes the client's params: %s", r.body)
				}
				ln.expectNoDial(t)
			})
		}
	}

	// A refused decode leg may tell the prefill to free its KV; that must
	// not dial either, so wait a little for a late dial before the final
	// count.
	time.Sleep(500 * time.Millisecond)
	ln.expectNoDial(t)
	waitPoolsIdle(t, prefill, decode, open, narrow)

	// The control: params signed with the cluster's secret that name the
	// listener do make the decode dial it, so the zero counts above mean
	// something. The pull fails (the listener hangs up), and the client
	// still learns nothing about the address.
	t.Run("control: validly signed params naming the listener are dialed, and the failure says nothing about it", func(t *testing.T) {
		body := fresh()
		body["kv_transfer_params"] = signParams(t, forgedParams("127.0.0.1", ln.port, 40), body, time.Now().Add(time.Minute))
		r := postJSON(t, decode.url+"/v1/completions", body)
		if ln.n.Load() == 0 {
			t.Errorf("the decode did not dial the listener named by validly signed params: the zero counts above prove nothing")
		}
		if r.status < 500 {
			t.Errorf("status %d, want 5xx (the pull from the listener failed): %s", r.status, r.body)
		}
		checkErrorBody(t, r, ln.addr(), strconv.Itoa(ln.port))
		t.Logf("status %d: %s", r.status, errorMessage(r.body))
		waitPoolsIdle(t, decode)
	})
}

// Side-channel frames built by hand, as an attacker would (see
// docs/kv-transfer.md, "Wire format", and internal/kvxfer/handshake.go).
const (
	msgHello     = 1
	msgError     = 11
	msgChallenge = 12
	msgAuth      = 13
	nonceBytes   = 32
)

func kvFrame(typ byte, corr uint64, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	copy(b, "TKVX")
	b[4] = kvxfer.ProtocolVersion
	b[5] = typ
	binary.LittleEndian.PutUint64(b[8:16], corr)
	binary.LittleEndian.PutUint32(b[16:20], uint32(len(payload)))
	return append(b, payload...)
}

// readKVFrame reads one frame: its type and payload.
func readKVFrame(c net.Conn) (byte, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	if string(h[:4]) != "TKVX" {
		return 0, nil, fmt.Errorf("bad magic %q", h[:4])
	}
	n := binary.LittleEndian.Uint32(h[16:20])
	if n > 1<<16 {
		return 0, nil, fmt.Errorf("%d-byte payload", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c, p); err != nil {
		return 0, nil, err
	}
	return h[5], p, nil
}

// channelKey and handshakeMAC are the handshake's key derivation and
// proofs, written out from the protocol's description.
func channelKey(secret string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("tandem kv side channel v1"))
	return m.Sum(nil)
}

func handshakeMAC(key []byte, label string, nd, np []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tandem kv handshake " + label))
	m.Write(nd)
	m.Write(np)
	return m.Sum(nil)
}

// engineID is e's engine id, from its startup log line.
func engineID(t *testing.T, e *engine) string {
	t.Helper()
	m := regexp.MustCompile(`engine_id=([0-9a-f-]+)`).FindStringSubmatch(e.out.String())
	if m == nil {
		t.Fatalf("%s's log names no engine_id", e.name)
	}
	return m[1]
}

// abuseAddr is where the abusive connections come from: another loopback
// address than the decode engines', so per-address limits apply to them
// alone.
var abuseAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}

func dialAbuse(addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: abuseAddr, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// dialAbusive dials addr as dialAbuse does, closes the connection when the
// test ends, and returns it with the time it was open from.
func dialAbusive(t *testing.T, addr string) (net.Conn, time.Time) {
	t.Helper()
	c, err := dialAbuse(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, time.Now()
}

// sendHello sends a HELLO frame on c (correlation id corr) with a fresh
// nonce, and fails the test unless the producer answers with a CHALLENGE.
// It returns the nonce sent and the CHALLENGE's payload: the producer's
// nonce, then its proof.
func sendHello(t *testing.T, c net.Conn, corr uint64) (nonce, challenge []byte) {
	t.Helper()
	nonce = make([]byte, nonceBytes)
	rand.Read(nonce)
	if _, err := c.Write(kvFrame(msgHello, corr, nonce)); err != nil {
		t.Fatal(err)
	}
	typ, p, err := readKVFrame(c)
	if err != nil || typ != msgChallenge || len(p) != nonceBytes+sha256.Size {
		t.Fatalf("answer to HELLO: type %d, %d bytes, err %v; want a CHALLENGE", typ, len(p), err)
	}
	return nonce, p
}

// closeLimit is how long after its dial the producer must have closed an
// unauthenticated connection: the 3s authentication deadline plus slack
// for a busy machine.
const closeLimit = kvxfer.DefaultAuthTimeout + 2*time.Second

// waitServerClose reads (and discards) from c until the server closes it,
// and returns how long after start that was; it fails when c is still open
// 2×closeLimit after start.
func waitServerClose(c net.Conn, start time.Time) (time.Duration, error) {
	c.SetReadDeadline(start.Add(2 * closeLimit))
	_, err := io.Copy(io.Discard, c)
	d := time.Since(start)
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		return d, nil // EOF or RST: closed by the server
	case errors.As(err, &ne) && ne.Timeout():
		return d, fmt.Errorf("still open after %v", d.Round(time.Millisecond))
	default:
		return d, err
	}
}

// wantClosedInTime fails the test unless the producer closes c within
// closeLimit of start, and returns how long it took.
func wantClosedInTime(t *testing.T, c net.Conn, start time.Time) time.Duration {
	t.Helper()
	d, err := waitServerClose(c, start)
	if err != nil || d > closeLimit {
		t.Errorf("connection closed after %v (err %v), want closed by the producer within %v", d.Round(time.Millisecond), err, closeLimit)
	}
	return d
}

// TestSideChannelAbuse attacks a real prefill engine's side channel from
// 127.0.0.2 — silence after HELLO, garbage, a slow loris, a wrong secret,
// 300 idle connections — while real P/D requests go through the proxy:
// every abusive connection is closed by the producer within the
// authentication deadline, and every real request still takes the P/D
// path with the colocated engine's answer.
func TestSideChannelAbuse(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-peers")
	if c, err := dialAbuse("127.0.0.1:1"); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
		t.Skipf("cannot use %v as a source address here: %v", abuseAddr.IP, err)
	} else if c != nil {
		c.Close()
	}
	const vocab = 512

	ref := startEngine(t, engineSpec{name: "reference", model: model, env: withSecret})
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill", env: withSecret})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", env: withSecret})
	proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})
	side := "127.0.0.1:" + strconv.Itoa(prefill.kvPort)

	// The expected answers, computed before the abuse starts.
	const maxRequests = 12
	bodies := make([]map[string]any, maxRequests)
	wants := make([]generation, maxRequests)
	for i := range bodies {
		bodies[i] = completionBody(tokenPrompt(30000+uint64(i), 20+i%3*blockSize, vocab), samplings[i%2], i%4 == 3)
		wants[i], _ = generate(t, ref.url, "/v1/completions", bodies[i])
	}
	t.Run("a P/D request succeeds before the abuse", func(t *testing.T) {
		got, r := generate(t, proxy, "/v1/completions", bodies[0])
		if r.pd() != "remote" {
			t.Errorf("x-tandem-pd %q, want remote", r.pd())
		}
		sameGeneration(t, wants[0], got)
	})

	// Real requests run through the proxy, two at a time, until the abuse
	// is over.
	stop := make(chan struct{})
	var (
		mu       sync.Mutex
		problems []string
		served   atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	next.Store(1)
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)-1) % maxRequests
				r, err := tryPostJSON(proxy+"/v1/completions", bodies[i])
				var problem string
				switch {
				case err != nil:
					problem = err.Error()
				case r.status != 200 || r.pd() != "remote":
					problem = fmt.Sprintf("status %d, x-tandem-pd %q: %s", r.status, r.pd(), tail(string(r.body), 500))
				default:
					var got generation
					if s, _ := bodies[i]["stream"].(bool); s {
						got, err = parseStream(r.body)
					} else {
						got, err = parseResponse(r.body)
					}
					if err != nil {
						problem = err.Error()
					} else if d := cmp.Diff(wants[i], got); d != "" {
						problem = "answer differs from the colocated engine's (-colocated +proxy):\n" + d
					}
				}
				// A short pause between requests keeps two cores free enough
				// for the deadlines measured meanwhile.
				time.Sleep(10 * time.Millisecond)
				if problem != "" {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("request %d during the abuse: %s", i, problem))
					mu.Unlock()
				} else {
					served.Add(1)
				}
			}
		})
	}
	abuseStart := time.Now()

	t.Run("abusive connections", func(t *testing.T) {
		t.Run("an unauthenticated HELLO, then silence, is dropped", func(t *testing.T) {
			t.Parallel()
			c, start := dialAbusive(t, side)
			nd, p := sendHello(t, c, 1)
			// The hand-built frames are right: the producer's proof checks
			// out with the cluster's key, so the refusals below are about
			// authentication, not framing.
			if !hmac.Equal(p[nonceBytes:], handshakeMAC(channelKey(clusterSecret), "producer", nd, p[:nonceBytes])) {
				t.Errorf("the CHALLENGE's proof does not match the cluster's key: this test builds the handshake wrong")
			}
			d := wantClosedInTime(t, c, start)
			t.Logf("closed after %v", d.Round(time.Millisecond))
		})
		t.Run("garbage bytes are dropped", func(t *testing.T) {
			t.Parallel()
			c, start := dialAbusive(t, side)
			c.Write([]byte("GET / HTTP/1.1\r\nHost: prefill\r\n\r\n" + strings.Repeat("\x00\xff", 64)))
			d := wantClosedInTime(t, c, start)
			t.Logf("closed after %v", d.Round(time.Millisecond))
		})
		t.Run("a slow loris sending one byte a second is dropped at the deadline", func(t *testing.T) {
			t.Parallel()
			c, start := dialAbusive(t, side)
			nd := make([]byte, nonceBytes)
			rand.Read(nd)
			hello := kvFrame(msgHello, 1, nd)
			done := make(chan struct{})
			go func() {
				for _, b := range hello {
					select {
					case <-done:
						return
					case <-time.After(time.Second):
					}
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
				}
			}()
			d := wantClosedInTime(t, c, start)
			close(done)
			if d < kvxfer.DefaultHelloTimeout/2 {
				t.Errorf("closed after %v, before the slow loris did anything wrong (its HELLO is due within %v)", d.Round(time.Millisecond), kvxfer.DefaultHelloTimeout)
			}
			t.Logf("closed after %v", d.Round(time.Millisecond))
		})
		t.Run("a wrong secret is refused and dropped", func(t *testing.T) {
			t.Parallel()
			c, start := dialAbusive(t, side)
			nd, p := sendHello(t, c, 7)
			np := p[:nonceBytes]
			wrong := channelKey("not-the-cluster-secret-0123456789")
			if hmac.Equal(p[nonceBytes:], handshakeMAC(wrong, "producer", nd, np)) {
				t.Fatal("the producer's proof matches a wrong secret")
			}
			auth := append(handshakeMAC(wrong, "consumer", nd, np), make([]byte, 64)...)
			if _, err := c.Write(kvFrame(msgAuth, 7, auth)); err != nil {
				t.Fatal(err)
			}
			typ, p, err := readKVFrame(c)
			if err != nil || typ != msgError || len(p) < 2 {
				t.Errorf("answer to a wrong AUTH: type %d, err %v; want an ERROR", typ, err)
			} else if code := binary.LittleEndian.Uint16(p); code != uint16(kvxfer.CodeUnauthenticated) {
				t.Errorf("ERROR code %d, want %d (unauthenticated): %q", code, kvxfer.CodeUnauthenticated, p[2:])
			} else if id := engineID(t, prefill); bytes.Contains(p, []byte(id)) {
				t.Errorf("the refusal names the engine (%s): %q", id, p[2:])
			}
			d := wantClosedInTime(t, c, start)
			t.Logf("refused and closed after %v", d.Round(time.Millisecond))
		})
	})

	t.Run("300 idle connections are all closed within the deadline", func(t *testing.T) {
		const n = 300
		type result struct {
			d   time.Duration
			err error
		}
		results := make(chan result, n)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range n {
			start := time.Now()
			c, err := dialAbuse(side)
			if err != nil {
				results <- result{err: fmt.Errorf("dial: %w", err)}
				continue
			}
			conns = append(conns, c)
			go func() {
				d, err := waitServerClose(c, start)
				results <- result{d, err}
			}()
		}
		var fast, slowest time.Duration
		var late []string
		nfast := 0
		for range n {
			r := <-results
			if r.err != nil || r.d > closeLimit {
				if len(late) < 5 {
					late = append(late, fmt.Sprintf("after %v: %v", r.d.Round(time.Millisecond), r.err))
				}
				continue
			}
			if r.d < time.Second {
				nfast++
				fast = max(fast, r.d)
			}
			slowest = max(slowest, r.d)
		}
		if len(late) > 0 {
			t.Errorf("idle connections not closed by the producer within %v, e.g.:\n%s", closeLimit, strings.Join(late, "\n"))
		}
		t.Logf("%d connections refused at once (within %v), the rest closed by %v", nfast, fast.Round(time.Millisecond), slowest.Round(time.Millisecond))
	})

	// Let the real requests run a little past the last abuse, then stop.
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	abuse := time.Since(abuseStart)
	for _, p := range problems {
		t.Error(p)
	}
	if served.Load() < 3 {
		t.Errorf("only %d P/D requests succeeded during %v of abuse, want at least 3", served.Load(), abuse.Round(time.Millisecond))
	}
	t.Logf("%d P/D requests succeeded during %v of abuse", served.Load(), abuse.Round(time.Millisecond))

	t.Run("a P/D request succeeds after the abuse", func(t *testing.T) {
		body := completionBody(tokenPrompt(31000, 50, vocab), samplings[0], false)
		want, _ := generate(t, ref.url, "/v1/completions", body)
		before := decodeCounters(t, decode)
		got, r := generate(t, proxy, "/v1/completions", body)
		if r.pd() != "remote" {
			t.Errorf("x-tandem-pd %q, want remote", r.pd())
		}
		sameGeneration(t, want, got)
		checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)
	})
	if !strings.Contains(prefill.out.String(), "failed its handshake") {
		t.Errorf("the prefill's log does not mention the failed handshakes")
	}
	waitPoolsIdle(t, ref, prefill, decode)
}
