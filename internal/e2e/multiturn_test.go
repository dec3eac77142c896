package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// The engines' --kv-recompute-threshold and block size in these tests.
const (
	mtThreshold = 16
	mtBlock     = 16
)

// TestMultiTurnThroughTheProxy runs conversations through real processes:
// proxies in conversation mode in front of a prefill and decode engines
// started with --kv-bidirectional. Every turn must answer exactly what a
// colocated engine answers for the same prompt (text, and logprobs of every
// token, bit for bit) — for completions whose prompt carries the history
// as text, for chat, streamed or not, named by a conversation id or matched
// by prompt prefix. Turn 2's prefill must pull exactly the history's tokens
// it does not have cached from the decode and compute only the new ones;
// every failure the issue lists (a hold within the expiry margin, an
// expired hold, a rewritten history, a history under the recompute
// threshold, a decode restarted with the same engine id and ports) must
// recompute with a counted reason; and every pool, prefill and decode, is
// empty once the proxies stopped.
func TestMultiTurnThroughTheProxy(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--kv-decode-hold-ttl", "--kv-recompute-threshold", "--engine-id", "--kv-load-failure-policy")
	_, self, _, _ := runtime.Caller(0)
	template := filepath.Join(filepath.Dir(self), "..", "defaultmodel", "stories260K", "chat_template.jinja")
	common := []string{"--chat-template", template}
	bidir := slices.Concat([]string{"--kv-bidirectional", "--kv-recompute-threshold", strconv.Itoa(mtThreshold)}, common)
	ref := startEngine(t, engineSpec{name: "colocated", model: model, args: common, env: withSecret})
	// The prefill recomputes a history it cannot pull itself: no turn
	// needs the proxy's retry without the history.
	p := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill", env: withSecret,
		args: slices.Concat(bidir, []string{"--kv-load-failure-policy", "recompute"})})
	// A fixed engine id, so that its restart reuses it; room for the
	// conversations every subtest leaves held.
	d := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", env: withSecret,
		args: slices.Concat(bidir, []string{"--engine-id", "e2e-multiturn-decode", "--num-blocks", "256"})})
	// Holds shorter than the prefill's 5 s expiry margin.
	short := startEngine(t, engineSpec{name: "decode (3s holds)", model: model, role: "decode", env: withSecret,
		args: slices.Concat(bidir, []string{"--kv-decode-hold-ttl", "3s"})})
	proxy := startStoppableProxy(t, "proxy", []*engine{p}, []*engine{d},
		"--conversations", "--model", model, "--conversation-min-prefix-tokens", strconv.Itoa(mtThreshold))
	proxyShort := startStoppableProxy(t, "proxy (3s holds)", []*engine{p}, []*engine{short}, "--conversations")

	// turn sends body through px and to the colocated engine, checks the
	// answers are the same, and returns the proxy's and what the prefill
	// did during the turn.
	turn := func(t *testing.T, px *stoppableProxy, path string, body map[string]any) (generation, prefillDelta) {
		t.Helper()
		want, _ := generate(t, ref.url, path, body)
		before := scrape(t, p.url)
		got, r := generate(t, px.url, path, body)
		after := scrape(t, p.url)
		if r.pd() != "remote" {
			t.Errorf("x-tandem-pd %q, want remote", r.pd())
		}
		if strings.Contains(string(r.body), "kv_transfer_params") {
			t.Errorf("the client got kv_transfer_params: %s", tail(string(r.body), 500))
		}
		sameGeneration(t, want, got)
		return got, deltaOf(before, after)
	}
	completion := func(prompt string, n int, stream bool, conv string) map[string]any {
		b := map[string]any{"model": servedName, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1, "stream": stream}
		if conv != "" {
			b["conversation_id"] = conv
		}
		if stream {
			b["stream_options"] = map[string]any{"include_usage": true}
		}
		return b
	}
	// held is how many tokens of a turn's KV the decode holds: its prompt
	// and answer but the last sampled token.
	held := func(g generation) int { return g.PromptTokens + g.CompletionTokens - 1 }
	// pulledWhole checks that turn 2's prefill took all of a history of n
	// tokens from the decode but what its own cache had (whole blocks), and
	// computed only the rest of its prompt.
	pulledWhole := func(t *testing.T, g2 generation, n int, dl prefillDelta) {
		t.Helper()
		t.Logf("history of %d tokens: %v pulled, %v from the prefill's cache, %v computed of %d", n, dl.pulled, dl.hit, dl.computed, g2.PromptTokens)
		if dl.pulled != dl.external {
			t.Errorf("history tokens pulled %v, external_kv_transfer %v: want the same", dl.pulled, dl.external)
		}
		if dl.pulled+dl.hit != float64(n) || int(dl.hit)%mtBlock != 0 || dl.pulled < mtThreshold {
			t.Errorf("the prefill pulled %v history tokens and had %v cached, want the %d-token history pulled whole but for cached whole blocks", dl.pulled, dl.hit, n)
		}
		if dl.computed != float64(g2.PromptTokens-n) {
			t.Errorf("the prefill computed %v prompt tokens, want only the %d new ones", dl.computed, g2.PromptTokens-n)
		}
	}

	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "json", true: "stream"}[stream]
		t.Run("completions, the history as a text prefix, "+name, func(t *testing.T) {
			conv := "completions-" + name
			// Each conversation its own opening, so no turn hits another's
			// blocks in the prefill's own prefix cache.
			prompt1 := map[bool]string{false: "Once upon a time", true: "One day, a little dog"}[stream]
			g1, _ := turn(t, proxy, "/v1/completions", completion(prompt1, 60, stream, conv))
			g2, dl := turn(t, proxy, "/v1/completions", completion(prompt1+g1.Text+" The next day", 30, stream, conv))
			pulledWhole(t, g2, held(g1), dl)
		})
	}
	t.Run("chat", func(t *testing.T) {
		msgs := []map[string]any{{"role": "user", "content": "Tell me a story about a cat."}}
		chat := func(n int) map[string]any {
			return map[string]any{"model": servedName, "messages": msgs, "max_tokens": n, "temperature": 0, "logprobs": true, "top_logprobs": 1, "conversation_id": "chat"}
		}
		g1, _ := turn(t, proxy, "/v1/chat/completions", chat(60))
		msgs = append(msgs, map[string]any{"role": "assistant", "content": g1.Text},
			map[string]any{"role": "user", "content": "Then the cat went home."})
		g2, dl := turn(t, proxy, "/v1/chat/completions", chat(30))
		// The template puts the answer back as the decode generated it
		// (stories260K's trims messages, and this answer has nothing to
		// trim): the whole history is pulled.
		pulledWhole(t, g2, held(g1), dl)
	})
	t.Run("completions naming no conversation, matched by prompt prefix", func(t *testing.T) {
		prompt1 := "Sam had a big red ball"
		g1, _ := turn(t, proxy, "/v1/completions", completion(prompt1, 60, false, ""))
		g2, dl := turn(t, proxy, "/v1/completions", completion(prompt1+g1.Text+" Then", 30, false, ""))
		pulledWhole(t, g2, held(g1), dl)
		m := scrape(t, proxy.url)
		if hits := m.must(t, "tandem:proxy_conversation_prefix_lookups_total", `result="hit"`); hits != 1 {
			t.Errorf("the proxy counted %v prefix hits, want 1", hits)
		}
	})

	// The failures: each recomputes (the prefill's load-failure policy is
	// recompute), answers as the colocated engine, and is counted.
	recomputed := func(t *testing.T, dl prefillDelta, reason string) {
		t.Helper()
		if got := dl.reasons[reason]; got != 1 {
			t.Errorf("tandem:kv_history_recomputed_total{reason=%q} grew by %v, want 1 (all: %v)", reason, got, dl.reasons)
		}
	}
	t.Run("a hold ending within the expiry margin", func(t *testing.T) {
		prompt1 := "The sun was hot"
		g1, _ := turn(t, proxyShort, "/v1/completions", completion(prompt1, 60, false, "margin"))
		_, dl := turn(t, proxyShort, "/v1/completions", completion(prompt1+g1.Text+" Later", 20, false, "margin"))
		recomputed(t, dl, "expired")
		if dl.failures["expired"] != 1 || dl.pulled != 0 {
			t.Errorf("kv_transfer_failures_total{reason=expired} grew by %v and %v tokens were pulled; want a declined pull", dl.failures["expired"], dl.pulled)
		}
	})
	t.Run("an expired hold", func(t *testing.T) {
		prompt1 := "A girl named Mia"
		expiredBefore := scrape(t, short.url).must(t, "tandem:kv_leases_expired_total")
		evictedBefore := scrape(t, proxyShort.url).must(t, "tandem:proxy_conversation_evictions_total", `reason="expired"`)
		g1, _ := turn(t, proxyShort, "/v1/completions", completion(prompt1, 60, false, "expired"))
		testutil.WaitFor(t, "the decode's holds to expire", 15*time.Second, func() bool {
			m, err := tryScrape(short.url)
			v, ok := m.get("tandem:kv_conversation_holds")
			return err == nil && ok && v == 0
		})
		missBefore := scrape(t, proxyShort.url).must(t, "tandem:proxy_conversation_lookups_total", `result="miss"`)
		_, dl := turn(t, proxyShort, "/v1/completions", completion(prompt1+g1.Text+" Later", 20, false, "expired"))
		if got := scrape(t, short.url).must(t, "tandem:kv_leases_expired_total") - expiredBefore; got < 1 {
			t.Errorf("the decode counted %v expired holds, want at least 1", got)
		}
		// The proxy sends no params that can no longer work: it forgot the
		// conversation as expired, and turn 2 was a miss.
		m := scrape(t, proxyShort.url)
		if got := m.must(t, "tandem:proxy_conversation_evictions_total", `reason="expired"`) - evictedBefore; got < 1 {
			t.Errorf("the proxy forgot %v conversations as expired, want at least this one", got)
		}
		if got := m.must(t, "tandem:proxy_conversation_lookups_total", `result="miss"`) - missBefore; got != 1 {
			t.Errorf("turn 2 counted %v lookup misses, want 1", got)
		}
		if dl.recomputed != 0 {
			t.Errorf("the prefill recomputed a history it was never sent: %v", dl.reasons)
		}
		if dl.pulled != 0 || dl.computed != float64(dl.promptTokens) {
			t.Errorf("turn 2 pulled %v tokens and computed %v of %v", dl.pulled, dl.computed, dl.promptTokens)
		}
	})
	t.Run("a rewritten history (the client edits turn 1's answer)", func(t *testing.T) {
		prompt1 := "Ben and his mom went to the park"
		g1, _ := turn(t, proxy, "/v1/completions", completion(prompt1, 60, false, "rewrite"))
		// One word in the second half of the answer becomes another;
		// every other byte stays.
		text := g1.Text
		i := len(text)/2 + strings.IndexByte(text[len(text)/2:], ' ')
		j := i + 1 + strings.IndexAny(text[i+1:], " \n.,")
		if i < len(text)/2 || j <= i+1 {
			t.Fatalf("no word to edit in the second half of %q", text)
		}
		edited := text[:i] + " purple" + text[j:]
		t.Logf("turn 1 answered %q; the client sends back %q", text, edited)
		_, dl := turn(t, proxy, "/v1/completions", completion(prompt1+edited+" After that", 20, false, "rewrite"))
		recomputed(t, dl, "history_mismatch_partial")
		if dl.pulled == 0 || dl.pulled >= float64(held(g1)) {
			t.Errorf("pulled %v history tokens of %d, want the blocks before the edit only", dl.pulled, held(g1))
		}
	})
	t.Run("a history shorter than the recompute threshold", func(t *testing.T) {
		g1, _ := turn(t, proxy, "/v1/completions", completion("Tom", 6, false, "short"))
		if held(g1) >= mtThreshold {
			t.Fatalf("the history is %d tokens, want under %d", held(g1), mtThreshold)
		}
		_, dl := turn(t, proxy, "/v1/completions", completion("Tom"+g1.Text+" and", 10, false, "short"))
		recomputed(t, dl, "below_threshold")
		if dl.pulled != 0 {
			t.Errorf("%v history tokens pulled", dl.pulled)
		}
	})
	t.Run("a client leaving mid-stream leaves no hold", func(t *testing.T) {
		holds := func() float64 { return scrape(t, d.url).must(t, "tandem:kv_conversation_holds") }
		canceled := func() float64 {
			v, _ := scrape(t, proxy.url).get("tandem:proxy_requests_total", `outcome="client_canceled"`)
			return v
		}
		before, canceledBefore := holds(), canceled()
		b, _ := json.Marshal(completion("Lily saw a bird", 400, true, "abandoned"))
		resp, err := client.Post(proxy.url+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q, %v", line, err)
		}
		resp.Body.Close()
		testutil.WaitFor(t, "the decode to end the request", 10*time.Second, func() bool {
			return scrape(t, d.url).must(t, "vllm:num_requests_running") == 0
		})
		// Aborted, it held nothing; had it finished first, the proxy would
		// have released the hold the client never got to the end of.
		testutil.WaitFor(t, "the decode to hold no more conversations than before", 10*time.Second, func() bool { return holds() == before })
		if got := canceled() - canceledBefore; got != 1 {
			t.Errorf("the proxy counted %v requests the client left, want 1", got)
		}
	})
	// A decode restarted with the same engine id and ports (not a subtest:
	// the restarted process must outlive it, for the pool checks below).
	prompt1 := "The old man had a boat"
	g1, _ := turn(t, proxy, "/v1/completions", completion(prompt1, 40, false, "restart"))
	// Turn 2 pulls from the decode: the prefill knows the peer now.
	prompt2 := prompt1 + g1.Text + " One morning"
	g2, dl := turn(t, proxy, "/v1/completions", completion(prompt2, 60, false, "restart"))
	if dl.pulled == 0 {
		t.Fatal("restart: turn 2 pulled nothing: the prefill never met the decode")
	}
	d = d.restart(t)
	testutil.WaitFor(t, "the proxy to see the restarted decode", 10*time.Second, func() bool { return probeStatus(proxy.url+"/health") == http.StatusOK })
	// Turn 3's params name turn 2's hold, gone with the old process; the
	// new one registered its memory under another generation.
	prompt3 := prompt2 + g2.Text + " At noon"
	g3, dl := turn(t, proxy, "/v1/completions", completion(prompt3, 40, false, "restart"))
	recomputed(t, dl, "peer_restarted")
	if dl.pulled != 0 {
		t.Errorf("restart: %v history tokens pulled from a restarted decode", dl.pulled)
	}
	// The stale peer was dropped: the next turn pulls from the new process.
	g4, dl := turn(t, proxy, "/v1/completions", completion(prompt3+g3.Text+" At night", 20, false, "restart"))
	pulledWhole(t, g4, held(g3), dl)

	// A stopping proxy gives back the holds it remembers; the prefill's
	// leases all ended with their decode legs' DONE.
	for _, px := range []*stoppableProxy{proxy, proxyShort} {
		terminateProc(t, px.proc, 15*time.Second)
	}
	waitPoolsIdle(t, p, d, short)
	for _, e := range []*engine{d, short} {
		if v := scrape(t, e.url).must(t, "tandem:kv_conversation_holds"); v != 0 {
			t.Errorf("%s holds %v conversations after the proxies stopped", e.name, v)
		}
	}
}

// prefillDelta is what a prefill engine's metrics say it did during a turn.
type prefillDelta struct {
	pulled, external, hit, computed, promptTokens float64
	// recomputed sums reasons, the growth of
	// tandem:kv_history_recomputed_total by reason; failures that of
	// tandem:kv_transfer_failures_total.
	recomputed float64
	reasons    map[string]float64
	failures   map[string]float64
}

func deltaOf(before, after metrics) prefillDelta {
	diff := func(name string, labels ...string) float64 {
		a, _ := after.get(name, labels...)
		b, _ := before.get(name, labels...)
		return a - b
	}
	byLabel := func(name, label string) map[string]float64 {
		out := map[string]float64{}
		for series := range after {
			n, ls, _ := strings.Cut(series, "{")
			if n != name {
				continue
			}
			for l := range strings.SplitSeq(strings.TrimSuffix(ls, "}"), ",") {
				if v, ok := strings.CutPrefix(l, label+`="`); ok {
					v = strings.TrimSuffix(v, `"`)
					out[v] = diff(name, label+`="`+v+`"`)
				}
			}
		}
		return out
	}
	dl := prefillDelta{
		pulled:   diff("tandem:kv_history_tokens_pulled_total"),
		external: diff("vllm:prompt_tokens_by_source", `source="external_kv_transfer"`),
		hit:      diff("vllm:prompt_tokens_by_source", `source="local_cache_hit"`),
		computed: diff("vllm:prompt_tokens_by_source", `source="local_compute"`),
		reasons:  byLabel("tandem:kv_history_recomputed_total", "reason"),
		failures: byLabel("tandem:kv_transfer_failures_total", "reason"),
	}
	dl.promptTokens = dl.external + dl.hit + dl.computed
	for _, v := range dl.reasons {
		dl.recomputed += v
	}
	return dl
}

// probeStatus is the status of GET url, or 0 when it cannot be fetched.
func probeStatus(url string) int {
	resp, err := (&http.Client{Timeout: time.Second}).Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// terminateProc sends SIGTERM to p and waits for it to exit cleanly.
func terminateProc(t *testing.T, p *proc, limit time.Duration) {
	t.Helper()
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
	case <-time.After(limit):
		t.Fatalf("%s still running %v after SIGTERM", p.name, limit)
	}
}
