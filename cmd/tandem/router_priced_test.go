package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// TestSimPricedDeciderWeighsLoadAgainstRecompute runs the priced decider on
// one simulated prefill and one simulated decode whose prefill costs a
// deterministic 2 ms per token, with a 1 s TTFT objective and prompts of
// about 300 tokens (0.6 s to prefill on either engine):
//
//   - until an engine has been measured the static threshold decides
//     (reason unpriced_...);
//   - on idle engines a prompt is prefilled by the decode (no transfer, no
//     one to stall), reason priced_cheaper;
//   - with four streams running on the decode and the prefill idle, a
//     prompt is prefilled remotely (a local prefill would stall the four
//     streams 0.6 s each), reason priced_cheaper;
//   - while one such prompt is prefilling on the prefill engine, the next
//     would wait for it (1.2 s, past the TTFT objective) while a local
//     prefill would stall the streams past the TPOT rule: neither path is
//     within the objectives, and the sooner one, the decode, prefills it,
//     reason priced_sooner.
func TestSimPricedDeciderWeighsLoadAgainstRecompute(t *testing.T) {
	timing := []string{"--sim-ttft", "5ms", "--sim-prefill-per-token", "2ms", "--sim-itl", "20ms"}
	pre, _ := startSimEngine(t, append([]string{"--role", "prefill", "--kv-port", "0"}, timing...)...)
	dec, _ := startSimEngine(t, append([]string{"--role", "decode"}, timing...)...)
	tok, err := tokenizer.Load(simModelDir)
	if err != nil {
		t.Fatal(err)
	}
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}, Policy: factory.PolicyPrefix, PDDecider: priced.Name,
		Router: factory.Options{Threshold: 128, TTFTObjective: time.Second}, Tokenizer: tok, ScrapeInterval: 20 * time.Millisecond})
	waitHealthy(t, url)

	// prompt is a prompt of about n tokens that shares no block with any
	// other (its first words are its own).
	next := 0
	prompt := func(n int) string {
		next++
		var b strings.Builder
		fmt.Fprintf(&b, "Story %d of the day.", next)
		for i := 0; len(tok.Encode(b.String(), true)) < n; i++ {
			fmt.Fprintf(&b, " Lily %d saw a dog in the park.", next*100+i)
		}
		return b.String()
	}
	body := func(p string) string {
		return fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":4,"temperature":0,"ignore_eos":true}`, p)
	}
	send := func(p string) simAnswer {
		a := ask(t, url, "/v1/completions", body(p))
		if a.status != http.StatusOK {
			t.Fatalf("status %d: %s", a.status, a.body)
		}
		return a
	}

	// Nothing measured yet: the static threshold (128) decides. The short
	// prompt's prefill measures the decode's rate, which prices the
	// prefill's too until it has been measured itself.
	if a := send(prompt(100)); a.pd != "local; reason="+priced.Unpriced+"short_uncached" {
		t.Fatalf("the first prompt: x-tandem-pd %q, want the static threshold's local", a.pd)
	}
	// Idle engines: the decode prefills a long prompt itself, sooner than
	// a prefill engine and a transfer would, stalling no one.
	deadline := time.Now().Add(10 * time.Second)
	for pdCount(t, url, "local", priced.Cheaper) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("never priced on idle engines: decisions %v", pdCounts(t, url))
		}
		send(prompt(300))
	}
	if n := pdCount(t, url, "remote", priced.Cheaper) + pdCount(t, url, "remote", priced.WithinSLO); n > 0 {
		t.Errorf("%v prompts sent to the prefill engine while the decode was idle (decisions %v)", n, pdCounts(t, url))
	}

	// Four streams on the decode.
	ctx := t.Context()
	for i := range 4 {
		go stream(ctx, url, fmt.Sprintf(`{"model":"hf","prompt":"Once upon a time %d","max_tokens":450,"ignore_eos":true,"stream":true}`, i))
	}
	waitMetric(t, dec, "vllm:num_requests_running", 4)
	deadline = time.Now().Add(10 * time.Second)
	for pdCount(t, url, "remote", priced.Cheaper) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a busy decode never sent a prompt away: decisions %v", pdCounts(t, url))
		}
		send(prompt(300))
	}

	// One prompt prefilling remotely, then the next. The one to queue
	// behind is sent again if it was kept local: on a loaded host the
	// measured costs can put both paths past the objective for a moment
	// (priced_sooner), and the decode then prefills it itself.
	deadline = time.Now().Add(20 * time.Second)
	var first chan simAnswer
	post := func() {
		first = make(chan simAnswer, 1)
		go func(first chan simAnswer) {
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body(prompt(300))))
			if err != nil {
				first <- simAnswer{body: err.Error()}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			first <- simAnswer{status: resp.StatusCode, pd: resp.Header.Get(proxy.HeaderPD)}
		}(first)
	}
	post()
	// The proxy's own count of the prompts it has open on the prefill,
	// which the decider prices the prefill's queue by.
	for testutil.Metric(t, url, "tandem:proxy_backend_in_flight", `role="prefill"`) < 1 {
		select {
		case a := <-first:
			if a.status != http.StatusOK || a.pd == "remote" {
				t.Fatalf("the prompt to queue behind answered before it was seen prefilling: status %d, x-tandem-pd %q %s (decisions %v)", a.status, a.pd, a.body, pdCounts(t, url))
			}
			post()
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prefill engine never ran a prompt (decisions %v)", pdCounts(t, url))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a := send(prompt(300)); a.pd != "local; reason="+priced.Sooner {
		t.Errorf("a prompt behind a queued prefill: x-tandem-pd %q, want local; reason=%s (decisions %v)", a.pd, priced.Sooner, pdCounts(t, url))
	}
	if a := <-first; a.status != http.StatusOK || a.pd != "remote" {
		t.Errorf("the prompt before it: status %d, x-tandem-pd %q (%s), want 200 remote", a.status, a.pd, a.body)
	}
}

// stream posts a streaming request to url and reads it until it ends or
// ctx is done.
func stream(ctx context.Context, url, body string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
}

// waitMetric waits until the engine at url reports name ≥ want.
func waitMetric(t *testing.T, url, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.Metric(t, url, name, "") < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reported %s ≥ %v", url, name, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pdCounts returns the proxy's tandem:proxy_pd_decisions_total by
// "decision/reason".
func pdCounts(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `tandem:proxy_pd_decisions_total{decision="`)
		if !ok {
			continue
		}
		decision, rest, _ := strings.Cut(rest, `",reason="`)
		reason, rest, _ := strings.Cut(rest, `"}`)
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[decision+"/"+reason] = v
	}
	return out
}

func pdCount(t *testing.T, url, decision, reason string) float64 {
	return pdCounts(t, url)[decision+"/"+reason]
}
