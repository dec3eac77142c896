package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// decodeKV is what a --kv-bidirectional decode named name returns at the end
// of a turn, with odd spacing and number spellings to check it travels
// verbatim. expires is remote_blocks_expiry_time in Unix seconds.
func decodeKV(name string, expires float64) string {
	return fmt.Sprintf(`{"do_remote_decode": true,"do_remote_prefill":false,"remote_block_ids":[[7, 8,9]],"remote_engine_id":%q,"remote_request_id":"r-2","remote_host":"127.0.0.1","remote_port":5601,"tp_size":1,"remote_num_tokens":4.0e1,"remote_blocks_expiry_time":%.3f,"tandem_signature":"c2ln"}`, "d-"+name, expires)
}

// Turn answers of a bidirectional decode, without their params, as the
// client must receive them.
const (
	turnJSON     = `{"id":"cmpl-2","choices":[{"text":"hello","finish_reason":"stop"}],"usage":{"prompt_tokens":3}}`
	turnSSEFirst = "data: {\"choices\":[{\"text\":\"hel\"}]}\n\n"
	turnSSELast  = "data: {\"choices\":[{\"text\":\"lo\",\"finish_reason\":\"stop\"}]}\n\n"
	turnSSEDone  = "data: [DONE]\n\n"
)

// bidiDecode answers like a decode engine started with --kv-bidirectional:
// the turn's answer plus kv_transfer_params naming name's held blocks, in
// the JSON body or in the stream's last chunk.
func bidiDecode(name string, expires float64) func(w http.ResponseWriter, r *http.Request, body []byte) {
	kv := decodeKV(name, expires)
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/tandem/kv/release" {
			io.WriteString(w, `{"released":true}`)
			return
		}
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, strings.TrimSuffix(turnJSON, "}")+`,"kv_transfer_params":`+kv+`}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, turnSSEFirst)
		w.(http.Flusher).Flush()
		io.WriteString(w, strings.Replace(turnSSELast, `}]}`, `}],"kv_transfer_params":`+kv+`}`, 1))
		w.(http.Flusher).Flush()
		io.WriteString(w, turnSSEDone)
	}
}

// legs returns the API requests an engine got, without KV releases.
func legs(f *fakeEngine) []received {
	var out []received
	for _, r := range f.requests() {
		if r.Path != "/tandem/kv/release" {
			out = append(out, r)
		}
	}
	return out
}

// waitReleases waits until f has received n KV releases and returns them.
func waitReleases(t *testing.T, f *fakeEngine, n int) []received {
	t.Helper()
	waitFor(t, func() bool { return len(releases(f)) >= n })
	return releases(f)
}

// prefillKVOf returns the kv_transfer_params a prefill leg carried, raw.
func prefillKVOf(t *testing.T, r received) string {
	t.Helper()
	o, err := parseObject([]byte(r.Body))
	if err != nil {
		t.Fatalf("prefill leg body %s: %v", r.Body, err)
	}
	return string(o.get(kvParamsKey))
}

func TestConversationTurns(t *testing.T) {
	const plainKV = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	expires := float64(time.Now().Add(time.Hour).Unix())
	tests := []struct {
		name       string
		stream     bool
		viaHeader  bool
		wantClient string
	}{
		{"a non-streaming turn named in the body", false, false, turnJSON},
		{"a streaming turn named in the body", true, false, turnSSEFirst + turnSSELast + turnSSEDone},
		{"a non-streaming turn named by the header", false, true, turnJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			decs := []*fakeEngine{newFake(t, bidiDecode("0", expires)), newFake(t, bidiDecode("1", expires))}
			p, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, decs)

			body := `{"model":"m","prompt":"Once upon","max_tokens":4`
			if tt.stream {
				body += `,"stream":true`
			}
			var h http.Header
			if tt.viaHeader {
				h = http.Header{HeaderConversationID: {"conv-1"}}
				body += `}`
			} else {
				body += `,"conversation_id":"conv-1"}`
			}
			turn := func(n int) (holder int) {
				t.Helper()
				resp, got := post(t, url, "/v1/completions", body, h)
				if resp.StatusCode != 200 || resp.Header.Get(HeaderPD) != "remote" {
					t.Fatalf("turn %d: %d %s %q", n, resp.StatusCode, resp.Header.Get(HeaderPD), got)
				}
				if got != tt.wantClient {
					t.Errorf("turn %d: the client got %q, want %q (the decode's params taken out, all else as sent)", n, got, tt.wantClient)
				}
				return whichGot(decs, resp.Header.Get("X-Request-Id"))
			}

			first := turn(1)
			if got := metricValue(t, p, "tandem:proxy_conversation_params_stored_total", nil); got != 1 {
				t.Errorf("params stored after turn 1: %v, want 1", got)
			}
			second := turn(2)

			plegs := pre.requests()
			if got := prefillKVOf(t, plegs[0]); got != plainKV {
				t.Errorf("turn 1's prefill leg carried %s, want the plain request", got)
			}
			if got, want := prefillKVOf(t, plegs[1]), decodeKV(fmt.Sprint(first), expires); got != want {
				t.Errorf("turn 2's prefill leg carried\n%s\nwant the decode's params verbatim\n%s", got, want)
			}
			if second != first {
				t.Errorf("turn 2's decode leg went to decode %d, turn 1's to %d: want the same decode", second, first)
			}
			for _, r := range append(plegs, append(decs[0].requests(), decs[1].requests()...)...) {
				if strings.Contains(r.Body, "conversation_id") {
					t.Errorf("a leg to %s carried the conversation id: %s", r.Path, r.Body)
				}
			}
			for name, want := range map[string]float64{
				"tandem:proxy_conversation_lookups_total{result=miss}":                1,
				"tandem:proxy_conversation_lookups_total{result=hit}":                 1,
				"tandem:proxy_conversation_history_prefills_total":                    1,
				"tandem:proxy_conversation_decode_affinity_total{result=same_decode}": 1,
				"tandem:proxy_conversation_params_stored_total":                       2,
				"tandem:proxy_conversations":                                          1,
				"tandem:proxy_conversation_prefill_retries_total{reason=prefill_4xx}": 0,
			} {
				metric, labels := splitMetric(name)
				if got := metricValue(t, p, metric, labels); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
		})
	}
}

// splitMetric splits "name{k=v}" into the name and its labels.
func splitMetric(s string) (string, map[string]string) {
	name, rest, ok := strings.Cut(s, "{")
	if !ok {
		return s, nil
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		labels[k] = v
	}
	return name, labels
}

func TestConversationModeOffChangesNothing(t *testing.T) {
	kv := decodeKV("0", float64(time.Now().Add(time.Hour).Unix()))
	pre := newFake(t, prefillOK)
	dec := newFake(t, bidiDecode("0", float64(time.Now().Add(time.Hour).Unix())))
	p, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	const client = `{"prompt":"x","conversation_id":"c","max_tokens":2}`
	for turn := 1; turn <= 2; turn++ {
		_, got := post(t, url, "/v1/completions", client, http.Header{HeaderConversationID: {"c"}})
		if want := strings.TrimSuffix(turnJSON, "}") + `,"kv_transfer_params":` + kv + `}`; got != want {
			t.Errorf("turn %d: the client got %s, want the decode's answer untouched %s", turn, got, want)
		}
	}
	want := []string{
		`{"prompt":"x","conversation_id":"c","max_tokens":1,"stream":false,` + wantPrefillKV + `}`,
		`{"prompt":"x","conversation_id":"c","max_tokens":1,"stream":false,` + wantPrefillKV + `}`,
	}
	var got []string
	for _, r := range pre.requests() {
		got = append(got, r.Body)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("prefill legs (-want +got):\n%s", diff)
	}
	if got := dec.requests()[1].Body; got != `{"prompt":"x","conversation_id":"c","max_tokens":2,"kv_transfer_params":`+testKV+`}` {
		t.Errorf("decode leg %s", got)
	}
	if got := metricValue(t, p, "tandem:proxy_conversation_lookups_total", map[string]string{"result": "miss"}); got != 0 {
		t.Errorf("lookups counted with the mode off: %v", got)
	}
}

func TestConversationIDRefused(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		header string
	}{
		{"a number", `{"prompt":"x","conversation_id":42}`, ""},
		{"an object", `{"prompt":"x","conversation_id":{"a":1}}`, ""},
		{"body and header disagree", `{"prompt":"x","conversation_id":"a"}`, "b"},
		{"too long", `{"prompt":"x","conversation_id":"` + strings.Repeat("a", 257) + `"}`, ""},
		{"a header too long", `{"prompt":"x"}`, strings.Repeat("a", 257)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			h := http.Header{}
			if tt.header != "" {
				h.Set(HeaderConversationID, tt.header)
			}
			resp, body := post(t, url, "/v1/completions", tt.body, h)
			checkOpenAIError(t, body, 400)
			if resp.StatusCode != 400 || !strings.Contains(body, `"param":"conversation_id"`) {
				t.Errorf("%d %s, want a 400 naming conversation_id", resp.StatusCode, body)
			}
			if n := len(pre.requests()) + len(dec.requests()); n != 0 {
				t.Errorf("engines got %d requests", n)
			}
		})
	}
	t.Run("null, empty and a body agreeing with the header are fine", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, decodeJSON)
		_, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		for _, c := range []struct{ body, header string }{
			{`{"prompt":"x","conversation_id":null}`, ""},
			{`{"prompt":"x","conversation_id":""}`, ""},
			{`{"prompt":"x","Conversation_ID":"a"}`, "a"},
		} {
			resp, body := post(t, url, "/v1/completions", c.body, http.Header{HeaderConversationID: {c.header}})
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d %s", c.body, resp.StatusCode, body)
			}
		}
		for _, r := range append(pre.requests(), dec.requests()...) {
			if strings.Contains(strings.ToLower(r.Body), "conversation_id") {
				t.Errorf("leg %s", r.Body)
			}
		}
	})
}

// fakeClock is a settable clock for the proxy's conversation memory.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestConversationExpiresWithTheDecodesHold(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	pre := newFake(t, prefillOK)
	dec := newFake(t, bidiDecode("0", float64(clock.now().Unix()+30)))
	p, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	p.now = clock.now
	const client = `{"prompt":"x","conversation_id":"c"}`

	post(t, url, "/v1/completions", client, nil)
	clock.advance(29 * time.Second)
	post(t, url, "/v1/completions", client, nil) // a hit; stores the turn again, still expiring at +30 s
	clock.advance(time.Second)
	post(t, url, "/v1/completions", client, nil) // the hold has ended: a miss

	var kvs []string
	for _, r := range pre.requests() {
		kvs = append(kvs, prefillKVOf(t, r))
	}
	if !strings.Contains(kvs[1], "d-0") || strings.Contains(kvs[2], "d-0") {
		t.Errorf("prefill legs carried %q: want the history on turn 2 only", kvs)
	}
	if got := metricValue(t, p, "tandem:proxy_conversation_evictions_total", map[string]string{"reason": "expired"}); got != 1 {
		t.Errorf("expired evictions %v, want 1", got)
	}
	if got := metricValue(t, p, "tandem:proxy_conversation_lookups_total", map[string]string{"result": "miss"}); got != 2 {
		t.Errorf("misses %v, want 2", got)
	}
}

func TestConversationsLRU(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var evicted []string
	c := newConversations(2, time.Minute, func(reason string, _ conversation) { evicted = append(evicted, reason) })
	put := func(id string, expires time.Time, now time.Time) {
		c.put(conversation{id: id, params: json.RawMessage(`{}`), expires: expires}, now)
	}
	put("a", t0.Add(time.Hour), t0)
	put("b", t0.Add(time.Hour), t0)
	put("a", t0.Add(time.Hour), t0) // a is now the most recent
	if !cmp.Equal(evicted, []string{evictReplaced}) {
		t.Errorf("evictions %q, want [replaced]", evicted)
	}
	evicted = nil
	put("c", t0.Add(time.Hour), t0) // b makes room
	if _, ok := c.take("b", t0); ok {
		t.Error("b was kept: want the least recently stored evicted")
	}
	if !cmp.Equal(evicted, []string{evictCapacity}) {
		t.Errorf("evictions %q", evicted)
	}
	if cv, ok := c.take("a", t0); !ok || cv.id != "a" {
		t.Error("a was lost")
	}
	if _, ok := c.take("a", t0); ok {
		t.Error("a taken twice: params are used once")
	}

	evicted = nil
	put("d", t0.Add(time.Second), t0)
	if _, ok := c.take("c", t0); !ok {
		t.Error("c was lost")
	}
	put("e", t0.Add(time.Hour), t0.Add(2*time.Second)) // d, least recent, has expired
	if c.len() != 1 {
		t.Errorf("%d entries, want 1 (e)", c.len())
	}
	if !cmp.Equal(evicted, []string{evictExpired}) {
		t.Errorf("evictions %q, want [expired]", evicted)
	}
	if _, ok := c.take("e", t0.Add(time.Hour)); ok {
		t.Error("e taken at its expiry")
	}
	if !cmp.Equal(evicted, []string{evictExpired, evictExpired}) {
		t.Errorf("evictions %q, want [expired expired]", evicted)
	}
}

func TestExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name   string
		params string
		want   time.Time
	}{
		{"the decode's expiry time", `{"remote_blocks_expiry_time":1800000010.25}`, time.Unix(1_800_000_010, 250_000_000)},
		{"no expiry time: the default TTL", `{"remote_port":1}`, now.Add(480 * time.Second)},
		{"null: the default TTL", `{"remote_blocks_expiry_time":null}`, now.Add(480 * time.Second)},
		{"not a number: the default TTL", `{"remote_blocks_expiry_time":"soon"}`, now.Add(480 * time.Second)},
		{"far in the future: capped", `{"remote_blocks_expiry_time":1e300}`, now.Add(maxConversationTTL)},
		{"in the past: as given", `{"remote_blocks_expiry_time":1700000000}`, time.Unix(1_700_000_000, 0)},
		// vLLM's decodes write their perf_counter deadline (recorded from
		// vLLM 0.32's NIXL connector): not a Unix time, so the hold is
		// counted from now as vLLM counted it from its answer, not taken as
		// long expired.
		{"a vLLM decode's perf_counter deadline: the default TTL", `{"remote_blocks_expiry_time":6365.671987221}`, now.Add(480 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := expiry(json.RawMessage(tt.params), now, 480*time.Second); !got.Equal(tt.want) {
				t.Errorf("expiry = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestConversationHistoryPrefillRetried(t *testing.T) {
	tests := []struct {
		name      string
		status    int // the prefill's answer to a leg with history params
		wantRetry string
	}{
		{"refused history params (400)", 400, "prefill_4xx"},
		{"a prefill that failed pulling the history (500)", 500, "prefill_5xx"},
		{"an answer without params", 200, "prefill_no_kv_params"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if strings.Contains(string(body), "remote_blocks_expiry_time") {
					w.WriteHeader(tt.status)
					io.WriteString(w, `{"error":{"message":"kv_transfer_params could not be used"}}`)
					return
				}
				prefillOK(w, r, body)
			})
			dec := newFake(t, bidiDecode("0", float64(time.Now().Add(time.Hour).Unix())))
			p, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			const client = `{"prompt":"x","conversation_id":"c"}`
			post(t, url, "/v1/completions", client, nil)
			resp, got := post(t, url, "/v1/completions", client, nil)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderPD) != "remote" {
				t.Fatalf("turn 2: %d %s %s, want the P/D path after the retry", resp.StatusCode, resp.Header.Get(HeaderPD), got)
			}
			plegs := pre.requests()
			if len(plegs) != 3 {
				t.Fatalf("prefill got %d legs, want 3 (turn 1, turn 2 with history, its retry)", len(plegs))
			}
			if !strings.Contains(prefillKVOf(t, plegs[1]), "d-0") {
				t.Errorf("turn 2's first prefill leg: %s", plegs[1].Body)
			}
			if want := `{"prompt":"x","stream":false,"max_tokens":1,` + wantPrefillKV + `}`; plegs[2].Body != want {
				t.Errorf("the retry carried %s, want the plain request %s", plegs[2].Body, want)
			}
			// The decode still holds the history nobody pulled.
			rel := waitReleases(t, dec, 1)
			if want := `{"kv_transfer_params":` + prefillKVOf(t, plegs[1]) + `}`; rel[0].Body != want {
				t.Errorf("release body %s, want %s", rel[0].Body, want)
			}
			waitFor(t, func() bool {
				return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": "history_not_pulled", "result": "released"}) == 1
			})
			if got := metricValue(t, p, "tandem:proxy_conversation_prefill_retries_total", map[string]string{"reason": tt.wantRetry}); got != 1 {
				t.Errorf("retries{reason=%s} = %v, want 1", tt.wantRetry, got)
			}
			if got := metricValue(t, p, "tandem:proxy_fallbacks_total", nil); got != 0 {
				t.Errorf("fallbacks %v, want 0", got)
			}
		})
	}

	t.Run("a retry that fails too falls back as without history", func(t *testing.T) {
		var calls int
		var mu sync.Mutex
		pre := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == 1 {
				prefillOK(w, r, body)
				return
			}
			w.WriteHeader(http.StatusInternalServerError)
		})
		dec := newFake(t, bidiDecode("0", float64(time.Now().Add(time.Hour).Unix())))
		_, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		const client = `{"prompt":"x","conversation_id":"c"}`
		post(t, url, "/v1/completions", client, nil)
		resp, _ := post(t, url, "/v1/completions", client, nil)
		if got := resp.Header.Get(HeaderPD); got != "fallback; reason=prefill_5xx; status=500" {
			t.Errorf("%s = %q", HeaderPD, got)
		}
		if n := len(pre.requests()); n != 3 {
			t.Errorf("prefill got %d legs, want 3: one retry, no more", n)
		}
		if got := legs(dec)[1].Body; got != `{"prompt":"x"}` {
			t.Errorf("fallback leg %s, want the client's body without conversation_id", got)
		}
	})
}

func TestConversationDecodeUnhealthyIsNotForced(t *testing.T) {
	expires := float64(time.Now().Add(time.Hour).Unix())
	pre := newFake(t, prefillOK)
	decs := []*fakeEngine{newFake(t, bidiDecode("0", expires)), newFake(t, bidiDecode("1", expires))}
	p, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, decs)
	const client = `{"prompt":"x","conversation_id":"c"}`
	resp, _ := post(t, url, "/v1/completions", client, nil)
	first := whichGot(decs, resp.Header.Get("X-Request-Id"))
	decs[first].health.Store(http.StatusServiceUnavailable)
	p.CheckHealth(t.Context())
	resp, body := post(t, url, "/v1/completions", client, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("turn 2: %d %s", resp.StatusCode, body)
	}
	if second := whichGot(decs, resp.Header.Get("X-Request-Id")); second == first {
		t.Errorf("turn 2 went to the unhealthy decode %d", first)
	}
	if !strings.Contains(prefillKVOf(t, pre.requests()[1]), fmt.Sprintf("d-%d", first)) {
		t.Errorf("turn 2's prefill leg did not carry the history: the prefill may still reach the decode's side channel")
	}
	if got := metricValue(t, p, "tandem:proxy_conversation_decode_affinity_total", map[string]string{"result": "decode_unhealthy"}); got != 1 {
		t.Errorf("affinity{decode_unhealthy} = %v, want 1", got)
	}
}

func TestConversationNeverForwardsClientKVParams(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, bidiDecode("0", float64(time.Now().Add(time.Hour).Unix())))
	_, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	// A client that read another turn's params (or made some up) and sends
	// them, in two spellings, with a conversation id.
	const client = `{"prompt":"x","conversation_id":"c","Kv_Transfer_Params":{"remote_host":"10.0.0.1","remote_port":1},"kv_transfer_params":{"do_remote_decode":true,"remote_host":"10.0.0.2","remote_blocks_expiry_time":9e9}}`
	for turn := range 2 {
		post(t, url, "/v1/completions", client, nil)
		for _, r := range []received{pre.requests()[turn], legs(dec)[turn]} {
			if strings.Contains(r.Body, "10.0.0.") || strings.Count(strings.ToLower(r.Body), kvParamsKey) != 1 {
				t.Errorf("turn %d: a leg carried the client's params: %s", turn+1, r.Body)
			}
		}
	}
	if got := prefillKVOf(t, pre.requests()[1]); !strings.Contains(got, `"remote_engine_id":"d-0"`) {
		t.Errorf("turn 2's prefill leg carried %s, want the decode's params", got)
	}
}

func TestPrefillLegAsksForOneSample(t *testing.T) {
	tests := []struct {
		name, client, wantPrefill, wantDecode string
	}{
		{
			"n and best_of become one sample on the prefill leg only",
			`{"prompt":"x","n":4,"best_of":5,"max_tokens":8}`,
			`{"prompt":"x","n":1,"max_tokens":1,"stream":false,` + wantPrefillKV + `}`,
			`{"prompt":"x","n":4,"best_of":5,"max_tokens":8,"kv_transfer_params":` + testKV + `}`,
		},
		{
			"in any letter case",
			`{"prompt":"x","N":3,"Best_Of":3}`,
			`{"prompt":"x","n":1,"stream":false,"max_tokens":1,` + wantPrefillKV + `}`,
			`{"prompt":"x","N":3,"Best_Of":3,"kv_transfer_params":` + testKV + `}`,
		},
		{
			"an absent n stays absent: it already means one",
			`{"prompt":"x"}`,
			`{"prompt":"x","stream":false,"max_tokens":1,` + wantPrefillKV + `}`,
			`{"prompt":"x","kv_transfer_params":` + testKV + `}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			dec := newFake(t, decodeJSON)
			_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
			post(t, url, "/v1/completions", tt.client, nil)
			if diff := cmp.Diff([]string{tt.wantPrefill, tt.wantDecode}, []string{pre.requests()[0].Body, dec.requests()[0].Body}); diff != "" {
				t.Errorf("legs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKVCapture(t *testing.T) {
	const kv = `{"remote_port":5601, "remote_block_ids":[[1]]}`
	tests := []struct {
		name, contentType, in, wantOut, wantKV string
	}{
		{
			"JSON: the top-level params are taken out",
			"application/json", `{"id":"a", "choices":[],"kv_transfer_params":` + kv + `,"usage":{}}`,
			`{"id":"a","choices":[],"usage":{}}`, kv,
		},
		{
			"JSON: null params stay",
			"application/json", `{"id":"a","kv_transfer_params":null}`,
			`{"id":"a","kv_transfer_params":null}`, "",
		},
		{
			"JSON: not an object stays as sent",
			"application/json", `[1, 2]`, `[1, 2]`, "",
		},
		{
			"SSE: the params chunk is rewritten, the rest untouched",
			"text/event-stream; charset=utf-8",
			"data: {\"choices\":[{\"text\":\"a\"}]}\n\n: comment kv_transfer_params\n\ndata: {\"choices\":[],\"kv_transfer_params\":" + kv + "}\r\n\r\ndata: [DONE]\n\n",
			"data: {\"choices\":[{\"text\":\"a\"}]}\n\n: comment kv_transfer_params\n\ndata: {\"choices\":[]}\r\n\r\ndata: [DONE]\n\n", kv,
		},
		{
			"SSE: a chunk with params in a nested object keeps them",
			"text/event-stream",
			"data: {\"choices\":[{\"kv_transfer_params\":{}}]}\n\ndata: [DONE]\n\n",
			"data: {\"choices\":[{\"kv_transfer_params\":{}}]}\n\ndata: [DONE]\n\n", "",
		},
		{
			"SSE: a last line without a newline",
			"text/event-stream",
			"data: {\"kv_transfer_params\":" + kv + "}",
			"data: {}", kv,
		},
	}
	for _, tt := range tests {
		for _, step := range []int{1, 7, len(tt.in)} {
			t.Run(fmt.Sprintf("%s, read %d bytes at a time", tt.name, step), func(t *testing.T) {
				c := newKVCapture(tt.contentType)
				var out []byte
				for in := tt.in; len(in) > 0; {
					n := min(step, len(in))
					out = append(out, c.feed([]byte(in[:n]))...)
					in = in[n:]
				}
				out = append(out, c.finish()...)
				if string(out) != tt.wantOut {
					t.Errorf("relayed %q, want %q", out, tt.wantOut)
				}
				if string(c.params) != tt.wantKV {
					t.Errorf("captured %q, want %q", c.params, tt.wantKV)
				}
			})
		}
	}

	t.Run("an answer too large to hold is relayed untouched", func(t *testing.T) {
		c := newKVCapture("application/json")
		big := `{"kv_transfer_params":` + kv + `,"x":"` + strings.Repeat("a", maxCaptureBytes) + `"}`
		var out []byte
		for in := big; len(in) > 0; {
			n := min(relayBufferBytes, len(in))
			out = append(out, c.feed([]byte(in[:n]))...)
			in = in[n:]
		}
		out = append(out, c.finish()...)
		if string(out) != big || c.params != nil {
			t.Errorf("relayed %d bytes (want %d), captured %q", len(out), len(big), c.params)
		}
	})
}

func TestConversationHoldsNoTurnUsesAreReleased(t *testing.T) {
	expires := float64(time.Now().Add(time.Hour).Unix())
	kv := decodeKV("0", expires)
	t.Run("a request naming no conversation: the client gets no params, the decode frees them", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, bidiDecode("0", expires))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
		for _, stream := range []bool{false, true} {
			_, got := post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":"x","stream":%t}`, stream), nil)
			if strings.Contains(got, "kv_transfer_params") {
				t.Errorf("the client got the decode's params: %s", got)
			}
		}
		for _, r := range waitReleases(t, dec, 2) {
			if want := `{"kv_transfer_params":` + kv + `}`; r.Body != want {
				t.Errorf("release %s, want %s", r.Body, want)
			}
		}
		if got := metricValue(t, p, "tandem:proxy_conversations", nil); got != 0 {
			t.Errorf("%v conversations remembered, want 0", got)
		}
		waitFor(t, func() bool {
			return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": "no_conversation", "result": "released"}) == 2
		})
	})
	t.Run("a conversation evicted for room: its hold is freed", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, bidiDecode("0", expires))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, ConversationMaxEntries: 1}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", `{"prompt":"x","conversation_id":"a"}`, nil)
		post(t, url, "/v1/completions", `{"prompt":"x","conversation_id":"b"}`, nil)
		if rel := waitReleases(t, dec, 1); rel[0].Body != `{"kv_transfer_params":`+kv+`}` {
			t.Errorf("release %s", rel[0].Body)
		}
		if got := metricValue(t, p, "tandem:proxy_conversation_evictions_total", map[string]string{"reason": "capacity"}); got != 1 {
			t.Errorf("capacity evictions %v, want 1", got)
		}
		post(t, url, "/v1/completions", `{"prompt":"x","conversation_id":"a"}`, nil)
		if got := prefillKVOf(t, pre.requests()[2]); strings.Contains(got, "d-0") {
			t.Errorf("the evicted conversation's turn 2 carried history %s", got)
		}
	})
}
