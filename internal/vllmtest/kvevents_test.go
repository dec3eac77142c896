package vllmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The shared-prefix workload against two vLLM engines, as the router tests
// run it against simulated ones (cmd/tandem's TestDefaultRoutingHitsThePrefixCache),
// smaller for vLLM on two cores: kvGroups groups of kvRequests requests, each
// group's prompts sharing a long system prompt (their first 254 of 279
// tokens), sent one at a time with the groups interleaved. kvGroups is odd so
// that round-robin over two engines sends each group to both.
const (
	kvGroups   = 3
	kvRequests = 4 // per group
	// kvHashSeed is the engines' PYTHONHASHSEED, the seed of vLLM's first
	// parent block hash: set so that an inherited PYTHONHASHSEED cannot make
	// the router's hashes differ from the engines'.
	kvHashSeed = "4242"
)

func kvSystemPrompt(g int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "System prompt %d. You are a helpful assistant for the team of group %d.", g, g)
	for i := range 5 {
		fmt.Fprintf(&b, " Rule %d of group %d: answer kindly, briefly and with care, like Lily in the park.", i, g)
	}
	return b.String()
}

// TestProxyRoutesOnVLLMsKVEvents runs `tandem proxy` in front of two vLLM
// engines that publish their KV cache events over ZMQ (--kv-events-config,
// block hashes by --prefix-caching-hash-algo sha256_cbor), once with
// --policy round-robin and once with --policy prefix following both
// engines' events (--kv-events, --model-fingerprint vllm:sha256_cbor:SEED),
// each arm with its own prompt groups on the same engines. It measures the
// engines' own prefix-cache hit ratio (vllm:prefix_cache_hits_total over
// vllm:prefix_cache_queries_total) in each arm, and requires that the
// router applied vLLM's event batches (none malformed) and that the precise
// arm's ratio is clearly higher: it keeps each group on the engine that
// reported storing its system prompt, round-robin sends each group to both.
func TestProxyRoutesOnVLLMsKVEvents(t *testing.T) {
	env := Require(t)
	model := smolModel(t)
	bin := buildTandem(t)
	var engines [2]*Server
	var pubs, replays [2]int
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range engines {
		var err error
		if pubs[i], err = FreePort(); err == nil {
			replays[i], err = FreePort()
		}
		if err != nil {
			t.Fatal(err)
		}
		// vLLM binds only wildcard tcp endpoints (it dials any other), and
		// Tandem's subscriber dials: tcp://*:PORT.
		cfg, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
			"endpoint": fmt.Sprintf("tcp://*:%d", pubs[i]), "replay_endpoint": fmt.Sprintf("tcp://*:%d", replays[i]), "topic": "kv"})
		wg.Go(func() {
			engines[i], errs[i] = start(env, Options{Model: model, BlockSize: 32,
				Args: []string{"--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor", "--kv-events-config", string(cfg)},
				Env:  []string{"PYTHONHASHSEED=" + kvHashSeed}})
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
	// Decode engines only (as TestProxyColocatedInFrontOfVLLM): every
	// request is served on the one engine the policy picks.
	backends := filepath.Join(t.TempDir(), "backends")
	if err := os.WriteFile(backends, []byte(fmt.Sprintf("decode %s\ndecode %s\n", engines[0].URL, engines[1].URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--backends-file", backends, "--pd-decider", "conditional",
		"--model", model, "--block-size", "32", "--scrape-interval", "1s", "--first-byte-timeout", "5m"}

	rr := runKVArm(t, bin, engines, 0, append([]string{"--policy", "round-robin"}, common...))

	precise := append([]string{"--policy", "prefix", "--model-fingerprint", "vllm:sha256_cbor:" + kvHashSeed}, common...)
	for i, s := range engines {
		precise = append(precise, "--kv-events", fmt.Sprintf("%s=tcp://127.0.0.1:%d;tcp://127.0.0.1:%d", s.URL, pubs[i], replays[i]))
	}
	pr := runKVArm(t, bin, engines, kvGroups, precise)

	t.Logf("engines' prefix-cache hit ratio (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, %d groups × %d requests over 2 vLLM engines): precise (prefix + vLLM's KV events) %.2f (%.0f/%.0f tokens; per engine %v), round-robin %.2f (%.0f/%.0f; per engine %v)",
		kvGroups, kvRequests, pr.hitRate(), pr.hits, pr.queries, pr.perEngine, rr.hitRate(), rr.hits, rr.queries, rr.perEngine)
	t.Logf("router's KV events: %.0f batches applied, %.0f malformed", pr.applied, pr.malformed)
	if pr.applied == 0 {
		t.Errorf("the router applied no KV event batch from vLLM's publishers")
	}
	if pr.malformed != 0 {
		t.Errorf("%.0f of vLLM's KV event batches were malformed to the router", pr.malformed)
	}
	if rr.queries == 0 || pr.queries == 0 {
		t.Fatalf("no prefix-cache queries counted (precise %v, round-robin %v)", pr.queries, rr.queries)
	}
	// Ideal, with 7 of each prompt's 8 full blocks of 32 tokens shared
	// (224 of 279 tokens): precise misses a group's system prompt once
	// (3 of 4 requests hit: 0.60 of the tokens), round-robin once per
	// engine (2 of 4: 0.40).
	if pr.hitRate() < rr.hitRate()+0.1 {
		t.Errorf("precise hit ratio %.2f, round-robin %.2f: want precise at least 0.1 higher", pr.hitRate(), rr.hitRate())
	}
}

// kvArm is what one routing arm did: the engines' prefix-cache counters over
// its requests (in tokens), and the router's KV-event counters.
type kvArm struct {
	hits, queries      float64
	perEngine          []string // "hits/queries" of each engine
	applied, malformed float64
}

func (a kvArm) hitRate() float64 {
	if a.queries == 0 {
		return 0
	}
	return a.hits / a.queries
}

// runKVArm starts `tandem proxy` with args in front of the engines, waits
// until it sees both healthy (and, when it follows KV events, connected to
// both publishers), sends the workload for groups firstGroup.. and returns
// the engines' counters' growth and the proxy's KV-event counters.
func runKVArm(t *testing.T, bin string, engines [2]*Server, firstGroup int, args []string) kvArm {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	var plog lockedBuffer
	proxy := exec.Command(bin, append([]string{"proxy", "--port", strconv.Itoa(port)}, args...)...)
	proxy.Stdout, proxy.Stderr = &plog, &plog
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		proxy.Process.Kill()
		proxy.Wait()
		if t.Failed() {
			t.Logf("proxy %v output:\n%s", args, tail(plog.String(), 6000))
		}
	}()
	waitDecodesHealthy(t, url, len(engines), 30*time.Second)
	following := strings.Contains(strings.Join(args, " "), "--kv-events")
	if following {
		waitMetric(t, url, "tandem:router_kv_events_connected", float64(len(engines)), 60*time.Second)
	}
	counters := func() (h, q float64, each []string) {
		for _, s := range engines {
			sh, _ := metric(t, s.URL, "vllm:prefix_cache_hits_total")
			sq, _ := metric(t, s.URL, "vllm:prefix_cache_queries_total")
			h, q = h+sh, q+sq
			each = append(each, fmt.Sprintf("%.0f/%.0f", sh, sq))
		}
		return h, q, each
	}
	h0, q0, each0 := counters()
	var a kvArm
	for r := range kvRequests {
		for g := firstGroup; g < firstGroup+kvGroups; g++ {
			prompt := fmt.Sprintf("%s Question %d: what should member %d of the team do today?", kvSystemPrompt(g), r, r)
			resp, body := post(t, url+"/v1/completions", map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("group %d request %d: %d %s", g, r, resp.StatusCode, body)
			}
			if pd := resp.Header.Get("X-Tandem-Pd"); !strings.HasPrefix(pd, "local") {
				t.Fatalf("group %d request %d: x-tandem-pd %q, want local (colocated)", g, r, pd)
			}
		}
	}
	// vLLM's API server updates its counters as it processes each step's
	// outputs; read them until they stop moving (or a deadline).
	h, q, each := counters()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		h2, q2, each2 := counters()
		if h2 == h && q2 == q {
			break
		}
		h, q, each = h2, q2, each2
	}
	a.hits, a.queries = h-h0, q-q0
	for i := range each {
		a.perEngine = append(a.perEngine, each0[i]+" → "+each[i])
	}
	if following {
		a.applied, _ = metric(t, url, "tandem:router_kv_events_batches_applied_total")
		a.malformed, _ = metric(t, url, "tandem:router_kv_events_malformed_total")
	}
	return a
}

// waitMetric waits until the sum of a metric's samples at url is want.
func waitMetric(t *testing.T, url, name string, want float64, timeout time.Duration) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if got, _ = metric(t, url, name); got == want {
			return
		}
	}
	t.Fatalf("%s at %s is %v after %v, want %v", name, url, got, timeout, want)
}
