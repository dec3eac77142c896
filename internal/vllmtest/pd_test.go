package vllmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// nixlKVConfig is vLLM's NIXL connector on the CPU: KV in host memory,
// moved by UCX (nixl's CUDA 13 wheel, which loads on a CPU-only host with
// the CUDA runtime PyPI's torch brings along).
const nixlKVConfig = `{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}`

// requireNixl skips (or fails, under TANDEM_REQUIRE_VLLM=1) when the
// environment's python cannot import nixl.
func requireNixl(t *testing.T, env Env) {
	t.Helper()
	out, err := exec.Command(env.Python(), "-c", "import nixl._api").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("vllmtest: the vLLM environment has no working nixl (%v: %s): rerun bash scripts/vllm/install.sh, which installs it", err, tail(string(out), 600))
	if requireVLLM() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestProxyDrivesVLLMPrefillAndDecode runs `tandem proxy --pd-decider
// always` in front of a vLLM prefill and a vLLM decode, both with vLLM's
// NIXL connector moving KV CPU to CPU: every request goes the remote path
// (x-tandem-pd: remote), the decode pulls the prompt's KV over NIXL (its
// transfer metrics count it), and the greedy answers equal the prefill
// engine's own to the plain request (colocated: its cache holds only KV it
// computed itself).
func TestProxyDrivesVLLMPrefillAndDecode(t *testing.T) {
	env := Require(t)
	requireNixl(t, env)
	model := smolModel(t)
	bin := buildTandem(t)
	var engines [2]*Server
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range engines {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			engines[i], errs[i] = start(env, Options{Model: model, BlockSize: 32,
				Args: []string{"--kv-transfer-config", nixlKVConfig},
				Env:  []string{"VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT=" + strconv.Itoa(port)}})
		})
	}
	wg.Wait()
	for i, s := range engines {
		if s != nil {
			t.Cleanup(func() {
				s.Stop()
				if t.Failed() {
					t.Logf("engine %d output:\n%s", i, tail(s.Output(), 6000))
				}
			})
		}
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	prefill, decode := engines[0], engines[1]
	// A first byte takes minutes on a loaded 2-core host (a 91-token
	// prompt's decode leg took 85 s by hand); the default limit (1m) cut it.
	proxy := startTandem(t, bin, time.Minute, "proxy", "--prefill", prefill.URL, "--decode", decode.URL,
		"--pd-decider", "always", "--policy", "round-robin", "--model", model, "--block-size", "32",
		"--first-byte-timeout", "5m")

	prompts := []string{
		"request one: " + strings.Repeat("the quick brown fox jumps over the lazy dog ", 12),
		"request two: " + strings.Repeat("a stitch in time saves nine ", 16),
	}
	answer := func(url, prompt string) (string, string) {
		resp, body := post(t, url+"/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", url, resp.StatusCode, body)
		}
		var a struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("%s: answer %s (%v)", url, body, err)
		}
		return a.Choices[0].Text, resp.Header.Get("X-Tandem-Pd")
	}
	for i, p := range prompts {
		got, pd := answer(proxy.url, p)
		if !strings.HasPrefix(pd, "remote") {
			t.Errorf("request %d: x-tandem-pd %q, want remote (vLLM prefill, vLLM decode)", i, pd)
		}
		// The decode's prefix cache holds the pulled KV now, so the
		// reference is the prefill engine serving the plain request alone.
		want, _ := answer(prefill.URL, p)
		if got != want {
			t.Errorf("request %d: through the proxy (P/D) %q, on one engine alone %q", i, got, want)
		}
	}
	if n, ok := metric(t, decode.URL, "vllm:nixl_bytes_transferred_count"); !ok || n < float64(len(prompts)) {
		t.Errorf("the decode's vllm:nixl_bytes_transferred_count is %v (exported: %v): want a NIXL read per request", n, ok)
	}
}
