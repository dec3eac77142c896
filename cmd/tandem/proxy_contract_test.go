package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestProxyReleasesTheHoldOfAClientGoneDuringThePrefill runs real engines:
// a client leaves while its prefill leg computes, and the prefill engine,
// its forward pass under way, finishes it and holds the KV for a decode leg
// that will never come. The proxy must release that hold at once: the
// prefill's pool is empty again long before the lease (60s) ends.
func TestProxyReleasesTheHoldOfAClientGoneDuringThePrefill(t *testing.T) {
	pre := startEngine(t, "--role", "prefill", "--kv-port", "0", "--kv-lease", "60s")
	dec := startEngine(t, "--role", "decode")
	target, _ := url.Parse(pre)
	engine := httputil.NewSingleHostReverseProxy(target)
	arrived, answered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// inProgress plays the prefill's forward pass already under way when
	// the client leaves: the leg reaches the engine whatever the proxy does
	// with its connection (300ms after arriving, or as soon as the proxy
	// drops it), and its answer goes back if the proxy still listens.
	inProgress := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			engine.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		once.Do(func() { close(arrived) })
		select {
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
		}
		resp, err := http.Post(pre+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Errorf("prefill leg: %v", err)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		close(answered)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(inProgress.Close)

	_, url := startTestProxy(t, proxy.Config{Prefill: []string{inProgress.URL}, Decode: []string{dec}, CanceledPrefillGrace: 10 * time.Second})
	waitHealthy(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(pdBody("")))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the prefill leg never arrived")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want context.Canceled", err)
	}
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("the prefill engine never answered the leg")
	}
	// The engine held the prompt's KV when it answered; the proxy's release
	// is all that frees it before the lease.
	deadline := time.Now().Add(5 * time.Second)
	for testutil.Metric(t, pre, "tandem:kv_blocks_held", "") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the prefill still holds %v KV blocks 5s after its answer to a client that had left (lease 60s)", testutil.Metric(t, pre, "tandem:kv_blocks_held", ""))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProxyServesABatchPrompt: a list of prompts, which a prefill refuses
// with kv_transfer_params, is served through the proxy by a decode's local
// prefill, and says so.
func TestProxyServesABatchPrompt(t *testing.T) {
	pre := startEngine(t, "--role", "prefill", "--kv-port", "0")
	dec := startEngine(t, "--role", "decode")
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
	waitHealthy(t, url)
	body := `{"model":"hf","prompt":["Once upon a time","Lily loved to play"],"max_tokens":4,"temperature":0}`
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch prompt through the proxy: %d %s", resp.StatusCode, raw)
	}
	if got := resp.Header.Get(proxy.HeaderPD); got != "local; reason=batch_prompt" {
		t.Errorf("%s = %q, want local; reason=batch_prompt", proxy.HeaderPD, got)
	}
	var r openai.CompletionResponse
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Choices) != 2 || r.Choices[1].Index != 1 {
		t.Errorf("answer %s (%v); want two choices, indexed 0 and 1", raw, err)
	}
}
