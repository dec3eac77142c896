package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

func TestParseProxyFlags(t *testing.T) {
	t.Run("keys come from the environment when the flags are not given", func(t *testing.T) {
		t.Setenv(openai.APIKeyEnv, "client-key")
		t.Setenv(backendAPIKeyEnv, "engine-key")
		f, err := parseProxyFlags([]string{"--prefill", "127.0.0.1:1", "--decode", "127.0.0.1:2"})
		if err != nil {
			t.Fatal(err)
		}
		if f.cfg.APIKey != "client-key" || f.cfg.BackendAPIKey != "engine-key" {
			t.Errorf("keys %q, %q; want the environment's", f.cfg.APIKey, f.cfg.BackendAPIKey)
		}
	})
	t.Run("flags win over the environment", func(t *testing.T) {
		t.Setenv(openai.APIKeyEnv, "env")
		t.Setenv(backendAPIKeyEnv, "env")
		f, err := parseProxyFlags([]string{"--prefill", "a:1", "--decode", "b:2", "--api-key", "flag-a", "--backend-api-key", "flag-b"})
		if err != nil {
			t.Fatal(err)
		}
		if f.cfg.APIKey != "flag-a" || f.cfg.BackendAPIKey != "flag-b" {
			t.Errorf("keys %q, %q; want the flags'", f.cfg.APIKey, f.cfg.BackendAPIKey)
		}
	})
	t.Run("no backends is an error", func(t *testing.T) {
		if _, err := parseProxyFlags(nil); err == nil || !strings.Contains(err.Error(), "--prefill") {
			t.Errorf("error %v", err)
		}
	})
}

func TestServeAPIKeyFromEnvironment(t *testing.T) {
	t.Setenv(openai.APIKeyEnv, "from-env")
	c, err := parseServeFlags([]string{"--model", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if c.APIKey != "from-env" {
		t.Errorf("APIKey %q, want from-env", c.APIKey)
	}
	c, err = parseServeFlags([]string{"--model", "m", "--api-key", "flag"})
	if err != nil {
		t.Fatal(err)
	}
	if c.APIKey != "flag" {
		t.Errorf("APIKey %q, want flag", c.APIKey)
	}
}

// startEngine runs `tandem serve` in-process with args and returns its base
// URL; the engine stops when the test ends.
func startEngine(t *testing.T, args ...string) string {
	t.Helper()
	f, err := parseServeFlags(append([]string{"--model", testmodels.Stories260K(t), "--port", "0", "--num-blocks", "64",
		"--max-num-seqs", "4", "--threads", "1", "--log-level", "error", "--shutdown-timeout", "5s"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + servertest.Start(t, f.Config).Addr()
}

// countingListener is a TCP listener the test owns: it counts the
// connections it accepts and closes them.
func countingListener(t *testing.T) (port int, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// startTestProxy runs a proxy over the given engines on loopback.
func startTestProxy(t *testing.T, cfg proxy.Config) (*proxy.Proxy, string) {
	t.Helper()
	cfg.Fallback = true
	cfg.Timeout = 30 * time.Second
	cfg.HealthInterval = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	return p, "http://" + ln.Addr().String()
}

// completion posts a greedy completion of prompt to url with header h and
// returns the status, the x-tandem-pd header and the text or error body.
func completion(t *testing.T, url, body string, h http.Header) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, h)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r openai.CompletionResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &r) != nil || len(r.Choices) != 1 {
		return resp.StatusCode, resp.Header.Get(proxy.HeaderPD), string(raw)
	}
	return resp.StatusCode, resp.Header.Get(proxy.HeaderPD), r.Choices[0].Text
}

const pdPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends."

func pdBody(extra string) string {
	return fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":16,"temperature":0%s}`, pdPrompt, extra)
}

// postJSON posts body to url and returns the status and the body.
func postJSON(t *testing.T, url, body string, h http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, h)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// waitHealthy waits until the proxy's /health answers 200.
func waitHealthy(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never became healthy", url)
}

// TestProxyTrustBoundaryWithRealEngines runs a real prefill and decode
// engine (no KV secret, so a decode would dial any loopback address it is
// given) behind the proxy, all with one API key, as `tandem up` runs them.
func TestProxyTrustBoundaryWithRealEngines(t *testing.T) {
	const key = "test-cluster-key"
	pre := startEngine(t, "--role", "prefill", "--kv-port", "0", "--api-key", key)
	dec := startEngine(t, "--role", "decode", "--api-key", key)
	auth := http.Header{"Authorization": {"Bearer " + key}}

	status, _, want := completion(t, dec, pdBody(""), auth)
	if status != http.StatusOK {
		t.Fatalf("direct decode: %d %s", status, want)
	}
	_, remoteURL := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}, APIKey: key})
	waitHealthy(t, remoteURL)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	fallback, fallbackURL := startTestProxy(t, proxy.Config{Prefill: []string{deadURL}, Decode: []string{dec}, APIKey: key})
	fallback.CheckHealth(context.Background()) // never ready without a prefill; the decode is healthy after this

	t.Run("API keys", func(t *testing.T) {
		for _, c := range []struct {
			name       string
			url        string
			header     http.Header
			wantStatus int
		}{
			{"the proxy refuses a request without a key", remoteURL, nil, http.StatusUnauthorized},
			{"the proxy refuses a wrong key", remoteURL, http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
			{"the proxy serves the right key and sends its own to the engines", remoteURL, auth, http.StatusOK},
			{"an engine refuses a request without a key", dec, nil, http.StatusUnauthorized},
			{"an engine refuses a wrong key", pre, http.Header{"Authorization": {"Bearer " + key + "x"}}, http.StatusUnauthorized},
		} {
			t.Run(c.name, func(t *testing.T) {
				status, _, text := completion(t, c.url, pdBody(""), c.header)
				if status != c.wantStatus {
					t.Fatalf("status %d (%s), want %d", status, text, c.wantStatus)
				}
				if status == http.StatusOK && text != want {
					t.Errorf("text %q, want %q", text, want)
				}
				if status == http.StatusUnauthorized && !strings.Contains(text, `"type":"AuthenticationError"`) {
					t.Errorf("401 body %s is not OpenAI-shaped", text)
				}
			})
		}
		t.Run("vLLM's toy proxy header (Bearer $OPENAI_API_KEY) works on an engine, and so does releasing the KV it held", func(t *testing.T) {
			t.Setenv("OPENAI_API_KEY", key)
			h := http.Header{"Authorization": {"Bearer " + os.Getenv("OPENAI_API_KEY")}, "X-Request-Id": {uuid.NewString()}}
			body := pdBody(`,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
			status, raw := postJSON(t, pre+"/v1/completions", body, h)
			if status != http.StatusOK {
				t.Fatalf("prefill leg: %d %s", status, raw)
			}
			var answer struct {
				KV json.RawMessage `json:"kv_transfer_params"`
			}
			if err := json.Unmarshal([]byte(raw), &answer); err != nil || len(answer.KV) == 0 {
				t.Fatalf("prefill answer without kv_transfer_params: %s", raw)
			}
			release := `{"kv_transfer_params":` + string(answer.KV) + `}`
			for _, step := range []struct {
				name   string
				header http.Header
				want   int
			}{
				{"without the key", nil, http.StatusUnauthorized},
				{"with the key", auth, http.StatusOK},
				{"a second time", auth, http.StatusNotFound},
			} {
				if status, raw := postJSON(t, pre+openai.KVReleasePath, release, step.header); status != step.want {
					t.Errorf("release %s: %d %s, want %d", step.name, status, raw, step.want)
				}
			}
		})
		t.Run("health and metrics stay open", func(t *testing.T) {
			for _, u := range []string{pre + "/health", dec + "/metrics", remoteURL + "/health", remoteURL + "/metrics"} {
				resp, err := http.Get(u)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("GET %s: %d", u, resp.StatusCode)
				}
			}
		})
	})

	for _, field := range []string{"kv_transfer_params", "KV_Transfer_Params"} {
		for _, path := range []struct{ name, url, wantPD string }{
			{"remote", remoteURL, "remote"},
			{"fallback (prefill down)", fallbackURL, "fallback; reason=no_healthy_prefill"},
		} {
			t.Run(fmt.Sprintf("client-written %s are not forwarded on the %s path", field, path.name), func(t *testing.T) {
				port, accepted := countingListener(t)
				kv := fmt.Sprintf(`,%q:{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"evil","remote_request_id":"x","remote_host":"127.0.0.1","remote_port":%d,"remote_block_ids":[[0,1,2]]}`, field, port)
				status, pd, text := completion(t, path.url, pdBody(kv), auth)
				if status != http.StatusOK || text != want {
					t.Errorf("answer %d %q, want 200 %q", status, text, want)
				}
				if pd != path.wantPD {
					t.Errorf("%s = %q, want %q", proxy.HeaderPD, pd, path.wantPD)
				}
				time.Sleep(100 * time.Millisecond) // a dial would have landed by now
				if n := accepted.Load(); n != 0 {
					t.Errorf("the client's listener saw %d connections, want 0", n)
				}
			})
		}
	}
}
