package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// faultDeadline bounds how long any request of the fault tests may take:
// far below the proxy's 30s --timeout and the 30s default lease, so a
// request that only ends because something timed out fails the test.
const faultDeadline = 15 * time.Second

// timed runs f and fails t if it took longer than faultDeadline.
func timed(t *testing.T, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if d := time.Since(start); d > faultDeadline {
		t.Errorf("%s took %v, want under %v", what, d.Round(time.Millisecond), faultDeadline)
	}
}

// errorMessage is the message of an OpenAI-shaped error body, or the body.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return string(body)
}

// failures is the sum of a decode's tandem:kv_transfer_failures_total.
func failures(t *testing.T, e *engine) float64 {
	t.Helper()
	v, _ := scrape(t, e.url).get("tandem:kv_transfer_failures_total")
	return v
}

// TestPrefillFailures kills and restarts a real prefill engine around
// requests: nothing may hang, every answer must say what happened, and
// answers that succeed must still be the colocated engine's.
func TestPrefillFailures(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-load-failure-policy")
	const vocab = 512

	ref := startEngine(t, engineSpec{name: "reference", model: model})
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill"})
	decode := startEngine(t, engineSpec{name: "decode (fail policy)", model: model, role: "decode",
		args: []string{"--kv-load-failure-policy", "fail"}})
	recompute := startEngine(t, engineSpec{name: "decode (recompute policy)", model: model, role: "decode",
		args: []string{"--kv-load-failure-policy", "recompute"}})
	proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})

	seed := uint64(5000)
	fresh := func(stream bool) map[string]any {
		seed++
		return completionBody(tokenPrompt(seed, 40, vocab), samplings[0], stream)
	}

	t.Run("a request takes the P/D path before any fault", func(t *testing.T) {
		body := fresh(false)
		want, _ := generate(t, ref.url, "/v1/completions", body)
		got, r := generate(t, proxy, "/v1/completions", body)
		if r.pd() != "remote" {
			t.Fatalf("x-tandem-pd %q, want remote", r.pd())
		}
		sameGeneration(t, want, got)
	})

	t.Run("a prefill killed between the legs fails the decode's load clearly, or is recomputed", func(t *testing.T) {
		body := fresh(false)
		want, _ := generate(t, ref.url, "/v1/completions", body)
		// The proxy's prefill leg, by hand, so the kill falls between legs.
		leg := map[string]any{}
		maps.Copy(leg, body)
		leg["max_tokens"] = 1
		leg["kv_transfer_params"] = map[string]any{"do_remote_decode": true}
		r := postJSON(t, prefill.url+"/v1/completions", leg)
		var pr struct {
			KVTransferParams map[string]any `json:"kv_transfer_params"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &pr) != nil || pr.KVTransferParams == nil {
			t.Fatalf("prefill leg: status %d, want 200 with kv_transfer_params: %s", r.status, r.body)
		}
		prefill.kill(t)

		decodeBody := map[string]any{}
		maps.Copy(decodeBody, body)
		decodeBody["kv_transfer_params"] = pr.KVTransferParams

		before := failures(t, decode)
		timed(t, "the failed load", func() {
			r = postJSON(t, decode.url+"/v1/completions", decodeBody)
		})
		if r.status != http.StatusInternalServerError {
			t.Errorf("decode with --kv-load-failure-policy fail answered %d, want 500: %s", r.status, r.body)
		}
		// The client learns that the load failed and which request to look
		// up in the decode's log, never what the dial found (trust boundary:
		// an error must not make the decode a port scanner).
		msg := errorMessage(r.body)
		port := strconv.Itoa(prefill.kvPort)
		if strings.Contains(msg, port) || strings.Contains(strings.ToLower(msg), "refused") || !strings.Contains(msg, "could not be loaded") {
			t.Errorf("error %q should say the KV could not be loaded without naming the prefill's side channel (port %s) or what the dial found", msg, port)
		}
		t.Logf("decode's error: %s", msg)
		if after := failures(t, decode); after <= before {
			t.Errorf("tandem:kv_transfer_failures_total on the decode went from %v to %v, want an increase", before, after)
		}

		var got generation
		timed(t, "the recomputed request", func() {
			got, _ = generate(t, recompute.url, "/v1/completions", decodeBody)
		})
		sameGeneration(t, want, got)
		waitPoolsIdle(t, decode, recompute)
	})

	t.Run("with the prefill dead the proxy falls back to the decode and says why", func(t *testing.T) {
		if !prefill.exited() {
			t.Skip("the prefill is still running: the step that kills it failed")
		}
		body := fresh(false)
		want, _ := generate(t, ref.url, "/v1/completions", body)
		var got generation
		var r reply
		timed(t, "the fallback request", func() { got, r = generate(t, proxy, "/v1/completions", body) })
		if !strings.HasPrefix(r.pd(), "fallback; reason=") {
			t.Errorf("x-tandem-pd %q, want a fallback with its reason", r.pd())
		}
		t.Logf("x-tandem-pd: %s", r.pd())
		sameGeneration(t, want, got)
	})

	// Restarted here, not in the subtest, so the process outlives it.
	prefill = prefill.restart(t)
	t.Run("a prefill restarted on the same ports serves the next requests remotely", func(t *testing.T) {
		// The proxy marks the prefill healthy at its next health check
		// (every 200ms); until then requests fall back, which is fine.
		deadline := time.Now().Add(faultDeadline)
		for tries := 1; ; tries++ {
			body := fresh(false)
			before := decodeCounters(t, decode)
			got, r := generate(t, proxy, "/v1/completions", body)
			if r.pd() == "remote" {
				want, _ := generate(t, ref.url, "/v1/completions", body)
				sameGeneration(t, want, got)
				checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)
				t.Logf("remote again at request %d after the restart", tries)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("x-tandem-pd still %q %v after the prefill restarted, want remote", r.pd(), faultDeadline)
			}
		}
	})

	t.Run("a prefill killed while the decode streams does not cut the stream", func(t *testing.T) {
		body := fresh(true)
		body["max_tokens"] = 300
		body["ignore_eos"] = true
		want, _ := generate(t, ref.url, "/v1/completions", body)

		b, _ := json.Marshal(body)
		resp, err := client.Post(proxy+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Tandem-Pd") != "remote" {
			rb, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d, x-tandem-pd %q, want 200 remote: %s", resp.StatusCode, resp.Header.Get("X-Tandem-Pd"), rb)
		}
		var all bytes.Buffer
		br := bufio.NewReader(resp.Body)
		killed, after := false, 0
		timed(t, "the stream", func() {
			for {
				line, err := br.ReadBytes('\n')
				all.Write(line)
				if bytes.HasPrefix(line, []byte("data: ")) {
					if !killed {
						prefill.kill(t)
						killed = true
					} else {
						after++
					}
				}
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					t.Fatalf("reading the stream after %d events: %v", after, err)
				}
			}
		})
		t.Logf("%d events arrived after the kill", after)
		got, err := parseStream(all.Bytes())
		if err != nil {
			t.Fatalf("stream: %v\n%s", err, tail(all.String(), 2000))
		}
		sameGeneration(t, want, got)
	})

	waitPoolsIdle(t, ref, decode, recompute)
}

// TestMismatchedEnginesAreReported starts prefill and decode engines that
// cannot exchange KV (another block size, another KV dtype): a request
// through the proxy must fail at the handshake with the documented message
// (both values, and the flag that fixes it), and the prefill's blocks must
// come back when their lease runs out.
func TestMismatchedEnginesAreReported(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-lease", "--kv-cache-dtype")
	cases := []struct {
		name            string
		prefill, decode []string
		want            []string
	}{
		{"block size", []string{"--block-size", "16"}, []string{"--block-size", "32"},
			[]string{"block size", "16", "32", "--block-size"}},
		{"KV dtype", []string{"--kv-cache-dtype", "float32"}, []string{"--kv-cache-dtype", "bfloat16"},
			[]string{"KV dtype", "f32", "bf16", "--kv-cache-dtype"}},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefill := startEngine(t, engineSpec{name: "prefill (" + strings.Join(tc.prefill, " ") + ")", model: model, role: "prefill",
				args: append([]string{"--kv-lease", "2s"}, tc.prefill...)})
			decode := startEngine(t, engineSpec{name: "decode (" + strings.Join(tc.decode, " ") + ")", model: model, role: "decode",
				args: tc.decode})
			proxy := startProxy(t, "proxy", []*engine{prefill}, []*engine{decode})

			// Ten tokens are one block on either side, so the block count
			// in the params agrees and the request gets as far as the
			// handshake. The load fails before the first token, so a
			// stream fails with a status too.
			for i, st := range streamings {
				t.Run("a request "+st.name+" fails with both values in the message", func(t *testing.T) {
					body := completionBody(tokenPrompt(9000+uint64(10*ci+i), 10, 512), samplings[0], st.stream)
					before := failures(t, decode)
					var r reply
					timed(t, "the mismatched request", func() { r = postJSON(t, proxy+"/v1/completions", body) })
					if r.status != http.StatusInternalServerError {
						t.Errorf("status %d (x-tandem-pd %q), want 500: %s", r.status, r.pd(), r.body)
					}
					msg := errorMessage(r.body)
					t.Logf("status %d, x-tandem-pd %q: %s", r.status, r.pd(), msg)
					for _, want := range tc.want {
						if !strings.Contains(msg, want) {
							t.Errorf("error %q does not contain %q", msg, want)
						}
					}
					if after := failures(t, decode); after <= before {
						t.Errorf("tandem:kv_transfer_failures_total on the decode went from %v to %v, want an increase", before, after)
					}
				})
			}
			// The decode never read the prefill's blocks, so only the 2s
			// lease frees them.
			waitPoolsIdle(t, prefill, decode)
		})
	}
}
