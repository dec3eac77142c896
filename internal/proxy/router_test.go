package proxy

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// counts returns how many generation legs each engine received.
func counts(engines []*fakeEngine) []int {
	out := make([]int, len(engines))
	for i, e := range engines {
		for _, r := range e.requests() {
			if strings.HasPrefix(r.Path, "/v1/") {
				out[i]++
			}
		}
	}
	return out
}

func TestBurstDoesNotHerd(t *testing.T) {
	for _, policy := range []string{factory.PolicyLoad, factory.PolicyPrefix} {
		t.Run("policy "+policy+" spreads 64 simultaneous requests evenly over 8 decodes", func(t *testing.T) {
			pre := []*fakeEngine{newFake(t, prefillOK)}
			// Every decode leg waits until all 64 have arrived, so no
			// request finishes (and frees its slot) before the last one is
			// dispatched, however slow the machine (the race detector).
			const n = 64
			var arrived atomic.Int32
			all := make(chan struct{})
			barrier := func(w http.ResponseWriter, r *http.Request, body []byte) {
				if arrived.Add(1) == n {
					close(all)
				}
				select {
				case <-all:
				case <-time.After(10 * time.Second):
				}
				decodeJSON(w, r, body)
			}
			var dec []*fakeEngine
			for range 8 {
				dec = append(dec, newFake(t, barrier))
			}
			_, url := startProxy(t, Config{Fallback: true, Policy: policy, ScrapeInterval: -1}, pre, dec)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					post(t, url, "/v1/completions", `{"prompt":"same prompt for all","max_tokens":8}`, nil)
				})
			}
			wg.Wait()
			for i, n := range counts(dec) {
				if n != 8 {
					t.Errorf("decode %d got %d requests, want 8 (all: %v)", i, n, counts(dec))
				}
			}
		})
	}
}

func TestConditionalDisaggregation(t *testing.T) {
	long := strings.Repeat("a long system prompt shared by a group. ", 100) // ~1000 tokens
	tests := []struct {
		name    string
		cfg     Config
		prompts []string
		wantPD  []string
	}{
		{"a short prompt is prefilled on the decode", Config{}, []string{"hi"}, []string{"local; reason=short_uncached"}},
		{"a long prompt goes remote, and again once cached on its decode it stays local",
			Config{Policy: factory.PolicyPrefix}, []string{long, long}, []string{"remote", "local; reason=short_uncached"}},
		{"a must-remote length goes remote even when cached",
			Config{Policy: factory.PolicyPrefix, Router: factory.Options{MustRemote: 500}}, []string{long, long}, []string{"remote", "remote"}},
		{"a long prompt stays local when every prefill is saturated",
			Config{Router: factory.Options{MaxInFlight: 1}}, []string{long + "__busy__", long}, []string{"", "local; reason=prefill_saturated"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			block := make(chan struct{})
			pre := []*fakeEngine{newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if strings.Contains(string(body), "__busy__") {
					<-block
				}
				prefillOK(w, r, body)
			})}
			dec := []*fakeEngine{newFake(t, decodeJSON), newFake(t, decodeJSON)}
			cfg := tt.cfg
			cfg.Fallback, cfg.PDDecider, cfg.ScrapeInterval = true, "conditional", -1
			p, url := startProxy(t, cfg, pre, dec)
			var wg sync.WaitGroup
			defer func() { close(block); wg.Wait() }()
			for i, prompt := range tt.prompts {
				body := fmt.Sprintf(`{"prompt":%q,"max_tokens":4}`, prompt)
				if strings.HasSuffix(prompt, "__busy__") {
					wg.Go(func() { post(t, url, "/v1/completions", body, nil) })
					waitFor(t, func() bool { return p.prefill.list()[0].inFlight.Load() == 1 })
					continue
				}
				id := fmt.Sprintf("c-%d", i)
				resp, _ := post(t, url, "/v1/completions", body, http.Header{"X-Request-Id": {id}})
				if got := resp.Header.Get(HeaderPD); got != tt.wantPD[i] {
					t.Errorf("request %d: %s = %q, want %q", i, HeaderPD, got, tt.wantPD[i])
				}
				if strings.HasPrefix(tt.wantPD[i], "local") {
					if whichGot(pre, id) >= 0 {
						t.Errorf("request %d decided local reached the prefill", i)
					}
					d := whichGot(dec, id)
					for _, r := range dec[d].requests() {
						if r.Header.Get("X-Request-Id") == id && strings.Contains(r.Body, "kv_transfer_params") {
							t.Errorf("local decode leg carries kv_transfer_params: %s", r.Body)
						}
					}
				}
			}
			if n := metricValue(t, p, "tandem:proxy_pd_decisions_total", nil); n == 0 {
				t.Error("tandem:proxy_pd_decisions_total counted nothing")
			}
		})
	}
}

func TestFailedPrefillIsRetriedOnAnotherThenFallsBack(t *testing.T) {
	dead := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	good := newFake(t, prefillOK)
	dec := []*fakeEngine{newFake(t, decodeJSON)}
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{dead, good}, dec)
	for i := range 4 {
		resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		if got := resp.Header.Get(HeaderPD); got != "remote" {
			t.Fatalf("request %d with one dead prefill: %s = %q, want remote (retried on the other)", i, HeaderPD, got)
		}
	}
	if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": "prefill"}); n == 0 {
		t.Error("no prefill retry counted")
	}
	good.srv.Close() // the second prefill is killed too
	resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	if got := resp.Header.Get(HeaderPD); !strings.HasPrefix(got, "fallback; reason=") || resp.StatusCode != http.StatusOK {
		t.Errorf("both prefills dead: %d %s = %q, want 200 and a fallback", resp.StatusCode, HeaderPD, got)
	}
}

func TestDecodeFailingBeforeFirstByteIsRetried(t *testing.T) {
	pre := []*fakeEngine{newFake(t, prefillOK)}
	dead, good := newFake(t, decodeJSON), newFake(t, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, pre, []*fakeEngine{dead, good})
	dead.srv.Close() // healthy at the last check, dead now
	for i := range 2 {
		resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
			t.Fatalf("request %d: %d %s, want the other decode's answer", i, resp.StatusCode, body)
		}
	}
}

func TestAllSaturatedQueuesThen429(t *testing.T) {
	// saturated starts a proxy whose one decode slot (MaxInFlight 1) is
	// held by a request until free is called (at the latest when t ends).
	saturated := func(t *testing.T, queueTimeout time.Duration) (p *Proxy, url string, free func()) {
		release := make(chan struct{})
		free = sync.OnceFunc(func() { close(release) })
		pre := []*fakeEngine{newFake(t, prefillOK)}
		dec := []*fakeEngine{newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			<-release
			decodeJSON(w, r, body)
		})}
		p, url = startProxy(t, Config{Fallback: true, ScrapeInterval: -1, QueueTimeout: queueTimeout,
			Router: factory.Options{MaxInFlight: 1}}, pre, dec)
		var wg sync.WaitGroup
		wg.Go(func() { post(t, url, "/v1/completions", `{"prompt":"x"}`, nil) })
		t.Cleanup(func() { free(); wg.Wait() })
		waitFor(t, func() bool { return p.decode.list()[0].inFlight.Load() == 1 })
		return p, url, free
	}

	t.Run("a request that waits out the queue timeout gets 429", func(t *testing.T) {
		p, url, _ := saturated(t, 50*time.Millisecond)
		resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("saturated: %d Retry-After=%q %s, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if got := metricValue(t, p, "tandem:proxy_admission_total", map[string]string{"result": "rejected"}); got != 1 {
			t.Errorf("admission_total{result=rejected} = %v, want 1", got)
		}
	})
	t.Run("a queued request is admitted when a slot frees before its timeout", func(t *testing.T) {
		// The timeout is far longer than any scheduling delay: the
		// request is admitted because the slot freed, never by luck (a
		// 50ms timeout here failed under -race on a loaded machine).
		p, url, free := saturated(t, time.Minute)
		done := make(chan int, 1)
		go func() {
			resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
			done <- resp.StatusCode
		}()
		waitFor(t, func() bool { return len(p.queued) == 1 })
		free()
		if got := <-done; got != http.StatusOK {
			t.Errorf("queued request: %d, want 200", got)
		}
		if got := metricValue(t, p, "tandem:proxy_admission_total", map[string]string{"result": "admitted"}); got != 1 {
			t.Errorf("admission_total{result=admitted} = %v, want 1: the request waited in the queue", got)
		}
	})
}

// TestPrefixAwareRoutingHitsTheCache: groups of requests sharing a long
// system prompt. The prefix policy sends each group to one decode, so every
// request after a group's first finds its prefix cached there; round-robin
// scatters them.
func TestPrefixAwareRoutingHitsTheCache(t *testing.T) {
	// 7 groups over 8 decodes: round-robin's rotation is not aligned with
	// the groups, as in a real mix.
	const groups, perGroup, decodes = 7, 6, 8
	hitRate := func(policy string) float64 {
		pre := []*fakeEngine{newFake(t, prefillOK)}
		var dec []*fakeEngine
		for range decodes {
			dec = append(dec, newFake(t, decodeJSON))
		}
		_, url := startProxy(t, Config{Fallback: true, Policy: policy, ScrapeInterval: -1}, pre, dec)
		seen := map[[2]int]bool{} // (group, decode) pairs that have served the group: the decode caches its prefix
		hits, total := 0, 0
		for i := range perGroup {
			for g := range groups {
				id := fmt.Sprintf("g%d-%d", g, i)
				sys := strings.Repeat(fmt.Sprintf("system prompt of group %d. ", g), 40)
				post(t, url, "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, sys, i), http.Header{"X-Request-Id": {id}})
				d := whichGot(dec, id)
				if i > 0 {
					total++
					if seen[[2]int{g, d}] {
						hits++
					}
				}
				seen[[2]int{g, d}] = true
			}
		}
		return float64(hits) / float64(total)
	}
	rr, px := hitRate(factory.PolicyRoundRobin), hitRate(factory.PolicyPrefix)
	t.Logf("prefix-cache hit rate: round-robin %.2f, prefix %.2f", rr, px)
	if px < 0.95 || px < rr+0.3 {
		t.Errorf("prefix policy hit rate %.2f, round-robin %.2f: want ≥ 0.95 and far above", px, rr)
	}
}

func TestScrapedQueueSteersAway(t *testing.T) {
	metricsOf := func(waiting int) func(w http.ResponseWriter, r *http.Request, body []byte) {
		return func(w http.ResponseWriter, r *http.Request, body []byte) {
			if r.URL.Path == "/metrics" {
				fmt.Fprintf(w, "# HELP x\nvllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:num_requests_running{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", waiting)
				return
			}
			decodeJSON(w, r, body)
		}
	}
	pre := []*fakeEngine{newFake(t, prefillOK)}
	busy, idle := newFake(t, metricsOf(50)), newFake(t, metricsOf(0))
	p, url := startProxy(t, Config{Fallback: true, Policy: factory.PolicyLoad, ScrapeInterval: time.Hour}, pre, []*fakeEngine{busy, idle})
	for _, b := range p.decode.list() {
		p.scrape(t.Context(), b)
	}
	for i := range 10 {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {fmt.Sprintf("s%d", i)}})
	}
	if got := counts([]*fakeEngine{busy, idle}); got[0] != 0 {
		t.Errorf("the engine with 50 waiting got %d of 10 requests", got[0])
	}
	// Stale metrics are ignored: the load spreads again.
	p.decode.stale = time.Nanosecond
	for i := range 10 {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {fmt.Sprintf("t%d", i)}})
	}
	if got := counts([]*fakeEngine{busy, idle}); got[0] == 0 {
		t.Errorf("stale metrics still steer: %v", got)
	}
}

// An engine's endpoint carries the change in the requests the router has
// open on it since its last scrape: the queue scorer adds it to the
// scraped queue, so a burst does not go to the engine whose scrape, up to
// a scrape interval old, showed it idle.
func TestEndpointCountsTheRequestsSinceTheScrape(t *testing.T) {
	eng := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n")
			return
		}
		decodeJSON(w, r, body)
	})
	p, _ := startProxy(t, Config{Policy: factory.PolicyLoad, ScrapeInterval: time.Hour}, []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{eng})
	b := p.decode.list()[0]
	first := b.acquire(10) // running when the engine is scraped
	p.scrape(t.Context(), b)
	if e := b.endpoint(time.Now(), time.Hour, 0); !e.Scraped || e.Running != 1 || e.SinceScrape != 0 {
		t.Fatalf("after the scrape: scraped %v running %v since %d, want true 1 0", e.Scraped, e.Running, e.SinceScrape)
	}
	b.acquire(10)
	b.acquire(10)
	first()
	if e := b.endpoint(time.Now(), time.Hour, 0); e.SinceScrape != 1 {
		t.Errorf("two sent and one finished since the scrape: SinceScrape %d, want 1", e.SinceScrape)
	}
}

func TestParseEngineMetrics(t *testing.T) {
	text := `# HELP vllm:num_requests_waiting x
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:num_requests_waiting{engine="1",model_name="m"} 2
vllm:num_requests_running{model_name="m"} 7 1700000000
vllm:kv_cache_usage_perc{model_name="a b"} 0.25
vllm:other 9
`
	s, ok := parseEngineMetrics(bufio.NewScanner(strings.NewReader(text)))
	if !ok || s.waiting != 5 || s.running != 7 || s.kvUsage != 0.25 {
		t.Errorf("got waiting=%v running=%v kv=%v ok=%v, want 5 7 0.25 true", s.waiting, s.running, s.kvUsage, ok)
	}
	if _, ok := parseEngineMetrics(bufio.NewScanner(strings.NewReader("up 1\n"))); ok {
		t.Error("metrics without vllm load gauges parsed as ok")
	}
}

func TestCircuitBreakerEjectsAnEngineFailingRequests(t *testing.T) {
	// Both answer /health; one fails every request with 500.
	bad := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	good := newFake(t, prefillOK)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, PrefillRetries: -1}, []*fakeEngine{bad, good}, []*fakeEngine{newFake(t, decodeJSON)})
	for range 10 {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	}
	if n := counts([]*fakeEngine{bad})[0]; n != breakerThreshold {
		t.Errorf("the failing prefill got %d requests, want %d before ejection", n, breakerThreshold)
	}
	p.CheckHealth(t.Context())
	if p.prefill.list()[0].healthy.Load() {
		t.Error("a health check re-admitted the ejected engine before its cool-down")
	}
}

func TestPrefillKilledMidRun(t *testing.T) {
	p0, p1 := newFake(t, prefillOK), newFake(t, prefillOK)
	dec := []*fakeEngine{newFake(t, decodeJSON), newFake(t, decodeJSON)}
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, Policy: factory.PolicyLoad}, []*fakeEngine{p0, p1}, dec)
	var mu sync.Mutex
	pd := map[string]int{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				if w == 0 && i == 10 {
					// Kill p0: its listener and open connections go.
					p0.srv.Listener.Close()
					p0.srv.CloseClientConnections()
				}
				resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
				mu.Lock()
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
					t.Errorf("status %d %s", resp.StatusCode, body)
				}
				pd[resp.Header.Get(HeaderPD)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("x-tandem-pd over 320 requests with a prefill killed: %v", pd)
	if pd["remote"] < 300 {
		t.Errorf("only %d of 320 remote: a dead prefill should cost retries, not remote prefill", pd["remote"])
	}
}

// TestScrapeTimeoutIsItsOwnBound checks that a scrape may take longer than
// the scrape interval: an engine busy computing answers /metrics late (vLLM
// on shared cores, past a 250ms interval), and a scrape cut at the interval
// failed every time. Config.ScrapeTimeout bounds it instead.
func TestScrapeTimeoutIsItsOwnBound(t *testing.T) {
	const answerAfter = 300 * time.Millisecond
	slow := func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/metrics" {
			time.Sleep(answerAfter) // the engine's own latency, not a settle wait
			fmt.Fprint(w, "vllm:num_requests_waiting 4\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n")
			return
		}
		decodeJSON(w, r, body)
	}
	for _, tt := range []struct {
		name    string
		timeout time.Duration
		ok      bool
	}{
		{"the default timeout outlasts a slow answer longer than the interval", 0, true},
		{"a shorter timeout cuts it", 50 * time.Millisecond, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// In a synctest bubble: the answer's 300 ms and the timeout are
			// fake time, so neither a loaded machine nor the race detector
			// can reorder them.
			inBubble(t, func(t *testing.T, mem *testutil.MemNet, _ *http.Client) {
				p, _ := startProxyOn(t, mem, Config{Fallback: true, ScrapeInterval: 100 * time.Millisecond, ScrapeTimeout: tt.timeout},
					[]*fakeEngine{newFakeOn(t, mem, prefillOK)}, []*fakeEngine{newFakeOn(t, mem, slow)})
				b := p.decode.list()[0]
				p.scrape(t.Context(), b)
				b.mu.Lock()
				waiting, scraped := b.waiting, !b.scrapedAt.IsZero()
				b.mu.Unlock()
				failures := metricValue(t, p, "tandem:proxy_scrape_failures_total", map[string]string{"role": "decode"})
				if tt.ok && (!scraped || waiting != 4 || failures != 0) {
					t.Errorf("scraped %v waiting %v, %v failures: want the late answer read", scraped, waiting, failures)
				}
				if !tt.ok && (scraped || failures != 1) {
					t.Errorf("scraped %v, %v failures: want the scrape cut and counted", scraped, failures)
				}
				timeout := tt.timeout
				if timeout == 0 {
					timeout = defaultScrapeTimeout
				}
				if want := 100*time.Millisecond + timeout; p.decode.stale < want {
					t.Errorf("stale after %v: a scrape landing at its timeout would be ignored (want ≥ %v)", p.decode.stale, want)
				}
			})
		})
	}
}
