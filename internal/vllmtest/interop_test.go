package vllmtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/modelinit"
)

// These tests run Tandem against real vLLM engines (vLLM's CPU build, from
// scripts/vllm/install.sh). Without that environment they skip, or fail
// under TANDEM_REQUIRE_VLLM=1; CI does not require vLLM.

// smolModel writes a random-weight smollm2-135m-shaped model (vLLM's CPU
// attention refuses the tiny shape's head size of 16).
func smolModel(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := modelinit.Init(dir, "smollm2-135m", "bf16", 1); err != nil {
		t.Fatal(err)
	}
	return dir
}

func post(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	resp, out, err := postE(url, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// postE is post for goroutines other than the test's. Its limit is wide: on
// two shared cores a vLLM engine computes slowly while others' work runs.
func postE(url string, body any) (*http.Response, []byte, error) {
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp, out, err
}

// metric sums the samples of name in a Prometheus text page.
func metric(t *testing.T, url, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line[strings.LastIndexByte(line, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// TestVLLMServesATandemModel starts vllm serve on a model directory Tandem
// wrote and checks a completion and the load metrics Tandem's proxy reads.
func TestVLLMServesATandemModel(t *testing.T) {
	env := Require(t)
	s := Start(t, env, Options{Model: smolModel(t), BlockSize: 32})
	resp, body := post(t, s.URL+"/v1/completions", map[string]any{"model": s.Name, "prompt": "hello world", "max_tokens": 4, "temperature": 0})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Usage.CompletionTokens != 4 {
		t.Fatalf("answer %s (%v): want 4 completion tokens", body, err)
	}
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
		if _, ok := metric(t, s.URL, name); !ok {
			t.Errorf("vLLM exports no %s", name)
		}
	}
}

// buildTandem builds cmd/tandem into a temporary directory.
func buildTandem(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tandem")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/tandem-serve/tandem/cmd/tandem")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestProxyColocatedInFrontOfVLLM runs `tandem proxy` with two vLLM engines
// as its (colocated) decode pool, routing by the load it scrapes from their
// /metrics: every request is answered, locally on one engine (no prefill
// pool), both engines serve, and most scrapes of vLLM's /metrics succeed.
func TestProxyColocatedInFrontOfVLLM(t *testing.T) {
	env := Require(t)
	model := smolModel(t)
	bin := buildTandem(t)
	var engines [2]*Server
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range engines {
		wg.Go(func() {
			engines[i], errs[i] = start(env, Options{Model: model, BlockSize: 32})
		})
	}
	wg.Wait()
	for i, s := range engines {
		if s != nil {
			t.Cleanup(s.Stop)
		}
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	// A backends file with decode engines only: the proxy then has an empty
	// prefill pool, and the conditional decider serves every request on the
	// chosen decode (colocated).
	backends := filepath.Join(t.TempDir(), "backends")
	if err := os.WriteFile(backends, []byte(fmt.Sprintf("decode %s\ndecode %s\n", engines[0].URL, engines[1].URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	proxyURL := "http://127.0.0.1:" + strconv.Itoa(port)
	// vLLM's /metrics on two cores busy with inference answers late; the
	// proxy's scrape timeout (--scrape-timeout, 2s) is its own bound, but a
	// scrape a second is plenty here and keeps the scrape count small.
	const scrapeInterval = time.Second
	var plog lockedBuffer
	proxyStart := time.Now()
	proxy := exec.Command(bin, "proxy", "--port", strconv.Itoa(port), "--backends-file", backends,
		"--policy", "load", "--pd-decider", "conditional", "--scrape-interval", scrapeInterval.String(), "--model", model, "--block-size", "32")
	proxy.Stdout, proxy.Stderr = &plog, &plog
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proxy.Process.Kill()
		proxy.Wait()
		if t.Failed() {
			t.Logf("proxy output:\n%s", plog.String())
		}
	})
	// The proxy is ready (/health 200) once one decode is healthy; the
	// test wants both.
	waitDecodesHealthy(t, proxyURL, len(engines), 30*time.Second)

	const n = 6
	var mu sync.Mutex
	pd := map[string]int{}
	var rg sync.WaitGroup
	for i := range n {
		rg.Go(func() {
			resp, body, err := postE(proxyURL+"/v1/completions", map[string]any{
				"model": "tiny", "prompt": fmt.Sprintf("request %d: %s", i, strings.Repeat("the quick brown fox ", 8)),
				"max_tokens": 4, "temperature": 0})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
				return
			}
			mu.Lock()
			pd[strings.SplitN(resp.Header.Get("X-Tandem-Pd"), ";", 2)[0]]++
			mu.Unlock()
		})
	}
	rg.Wait()
	if pd["local"] != n {
		t.Errorf("x-tandem-pd %v: want all %d local (colocated)", pd, n)
	}
	for i, s := range engines {
		if v, _ := metric(t, s.URL, "vllm:request_success_total"); v == 0 {
			t.Errorf("engine %d served no request: the proxy did not spread the load", i)
		}
	}
	// Most scrapes must succeed, or the proxy routes on its own counts only.
	scrapes := 2 * time.Since(proxyStart).Seconds() / scrapeInterval.Seconds()
	failed, _ := metric(t, proxyURL, "tandem:proxy_scrape_failures_total")
	t.Logf("%v of about %.0f scrapes of vLLM's /metrics failed", failed, scrapes)
	if failed > scrapes/2 {
		t.Errorf("%v of about %.0f scrapes of vLLM's /metrics failed", failed, scrapes)
	}
}

// waitDecodesHealthy waits until the proxy's /health lists n healthy decode
// engines.
func waitDecodesHealthy(t *testing.T, proxyURL string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(proxyURL + "/health")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(body)
			var h struct {
				Decode []struct {
					Healthy bool `json:"healthy"`
				} `json:"decode"`
			}
			healthy := 0
			if json.Unmarshal(body, &h) == nil {
				for _, d := range h.Decode {
					if d.Healthy {
						healthy++
					}
				}
			}
			if healthy == n {
				return
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("the proxy does not see %d healthy decodes after %v: %s", n, timeout, last)
}
