package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/tokenizer"
)

func TestConversationsMatchByHistory(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hour := t0.Add(time.Hour)
	// chain returns n chained "block hashes" of a history named by tag:
	// histories with the same tag share their blocks, so chain("a", 5) is
	// the first five blocks of chain("a", 10).
	chain := func(tag string, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(len(tag))<<56 | uint64(tag[0])<<48 | uint64(i+1)
		}
		return out
	}
	// fork is a's first k blocks followed by n−k of tag's own.
	fork := func(a string, k int, tag string, n int) []uint64 {
		out := chain(a, k)
		for _, h := range chain(tag, n)[k:] {
			out = append(out, h^1<<40)
		}
		return out
	}
	type event struct{ reason, name string }
	var evicted []event
	newStore := func(max int) *conversations {
		evicted = nil
		return newConversations(max, time.Minute, func(reason string, cv conversation) {
			evicted = append(evicted, event{reason, string(cv.params)})
		})
	}
	put := func(c *conversations, name string, history []uint64, expires time.Time) {
		c.put(conversation{params: json.RawMessage(name), history: history, expires: expires}, t0)
	}
	match := func(c *conversations, prompt []uint64, min int, now time.Time) string {
		cv, ok := c.match(prompt, min, now)
		if !ok {
			return "miss"
		}
		return fmt.Sprintf("%s %d %v", cv.params, cv.matched, cv.full)
	}

	t.Run("the longest match wins, then the newest", func(t *testing.T) {
		c := newStore(10)
		put(c, "a", chain("a", 10), hour)
		put(c, "b", fork("a", 6, "b", 12), hour) // shares a's first 6 blocks
		put(c, "c", chain("a", 6), hour)         // a's first 6: superseded by nothing, it is shorter
		for _, tt := range []struct {
			name   string
			prompt []uint64
			want   string
		}{
			{"a prompt continuing a", append(chain("a", 10), 99), "a 10 true"},
			{"a prompt leaving a after 8 blocks", append(chain("a", 8), 99), "a 8 false"},
			{"a prompt continuing b", fork("a", 6, "b", 14), "b 12 true"},
			{"a prompt that is the shared prefix: the newest of the three", chain("a", 6), "c 6 true"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c := newStore(10)
				put(c, "a", chain("a", 10), hour)
				put(c, "b", fork("a", 6, "b", 12), hour)
				put(c, "c", chain("a", 6), hour)
				if len(evicted) != 0 {
					t.Fatalf("evictions %v", evicted)
				}
				if got := match(c, tt.prompt, 4, t0); got != tt.want {
					t.Errorf("match = %q, want %q", got, tt.want)
				}
				if c.len() != 2 {
					t.Errorf("%d entries left, want 2: a match takes its entry", c.len())
				}
			})
		}
		_ = c
	})

	t.Run("fewer matching blocks than the least match: a miss", func(t *testing.T) {
		c := newStore(10)
		put(c, "a", chain("a", 10), hour)
		if got := match(c, fork("a", 3, "x", 10), 4, t0); got != "miss" {
			t.Errorf("3 shared blocks with a least match of 4: %q", got)
		}
		if got := match(c, fork("a", 4, "x", 10), 4, t0); got != "a 4 false" {
			t.Errorf("4 shared blocks with a least match of 4: %q", got)
		}
	})

	t.Run("a history extending a remembered one supersedes it", func(t *testing.T) {
		c := newStore(10)
		put(c, "turn1", chain("a", 5), hour)
		put(c, "other", chain("b", 5), hour)
		put(c, "turn2", chain("a", 9), hour)
		if want := []event{{evictReplaced, "turn1"}}; !slices.Equal(evicted, want) {
			t.Errorf("evictions %v, want %v", evicted, want)
		}
		put(c, "again", chain("a", 9), hour) // the same history once more
		if want := []event{{evictReplaced, "turn1"}, {evictReplaced, "turn2"}}; !slices.Equal(evicted, want) {
			t.Errorf("evictions %v, want %v", evicted, want)
		}
		put(c, "shorter", chain("a", 4), hour) // a prefix of "again": both kept
		if c.len() != 3 {
			t.Errorf("%d entries, want 3 (other, again, shorter)", c.len())
		}
	})

	t.Run("expired histories are dropped, not matched", func(t *testing.T) {
		c := newStore(10)
		put(c, "old", chain("a", 10), t0.Add(time.Second))
		put(c, "young", fork("a", 5, "y", 10), hour)
		if got := match(c, append(chain("a", 10), 7), 4, t0.Add(2*time.Second)); got != "young 5 false" {
			t.Errorf("match = %q, want the unexpired shorter match", got)
		}
		if want := []event{{evictExpired, "old"}}; !slices.Equal(evicted, want) {
			t.Errorf("evictions %v, want %v", evicted, want)
		}
	})

	t.Run("one LRU for conversations by id and by history", func(t *testing.T) {
		c := newStore(2)
		put(c, "h1", chain("a", 5), hour)
		c.put(conversation{id: "conv", params: json.RawMessage("byid"), expires: hour}, t0)
		put(c, "h2", chain("b", 5), hour)
		if want := []event{{evictCapacity, "h1"}}; !slices.Equal(evicted, want) {
			t.Errorf("evictions %v, want %v", evicted, want)
		}
		if got := match(c, chain("a", 6), 4, t0); got != "miss" {
			t.Errorf("an evicted history matched: %q", got)
		}
		if _, ok := c.take("conv", t0); !ok {
			t.Error("the conversation by id was lost")
		}
	})

	t.Run("long histories: dense then sparse index, nothing left behind", func(t *testing.T) {
		c := newStore(10)
		put(c, "long", chain("a", 100), hour)
		if got := match(c, fork("a", 50, "x", 60), 4, t0); got != "long 48 false" {
			t.Errorf("a prompt leaving the history at block 50 matched %q, want it at the indexed block 48", got)
		}
		put(c, "long", chain("a", 100), hour)
		if got := match(c, append(chain("a", 100), 5), 4, t0); got != "long 100 true" {
			t.Errorf("a prompt continuing the history matched %q", got)
		}
		put(c, "huge", chain("h", maxHistoryBlocks+500), hour)
		if got := match(c, chain("h", maxHistoryBlocks+600), 4, t0); got != fmt.Sprintf("huge %d false", maxHistoryBlocks) {
			t.Errorf("a history longer than maxHistoryBlocks matched %q", got)
		}
		if c.len() != 0 || len(c.byBlock) != 0 || len(c.byEnd) != 0 {
			t.Errorf("index not empty after every entry left: %d entries, %d block lists, %d ends", c.len(), len(c.byBlock), len(c.byEnd))
		}
	})
}

// fixtureTokenizer returns a BPE tokenizer with a ChatML template.
func fixtureTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir := t.TempDir()
	if _, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: 1024, ChatTemplate: true}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// answeringDecode answers like a --kv-bidirectional decode named name: the
// answer (a completion's text or a chat message, whole or streamed in two
// chunks) and kv_transfer_params naming its hold of numTokens tokens.
func answeringDecode(name, answer string, numTokens int) func(w http.ResponseWriter, r *http.Request, body []byte) {
	kv := strings.Replace(decodeKV(name, float64(time.Now().Add(time.Hour).Unix())), `"remote_num_tokens":4.0e1`, fmt.Sprintf(`"remote_num_tokens":%d`, numTokens), 1)
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/tandem/kv/release" {
			io.WriteString(w, `{"released":true}`)
			return
		}
		chat := r.URL.Path == "/v1/chat/completions"
		choice := func(text string, final bool) string {
			b, _ := json.Marshal(text)
			switch {
			case chat && strings.Contains(string(body), `"stream":true`):
				return `{"index":0,"delta":{"content":` + string(b) + `}}`
			case chat:
				return `{"index":0,"message":{"role":"assistant","content":` + string(b) + `},"finish_reason":"stop"}`
			}
			return `{"index":0,"text":` + string(b) + `}`
		}
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[`+choice(answer, true)+`],"kv_transfer_params":`+kv+`}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		half := len(answer) / 2
		io.WriteString(w, `data: {"choices":[`+choice(answer[:half], false)+`]}`+"\n\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, `data: {"choices":[`+choice(answer[half:], true)+`],"kv_transfer_params":`+kv+`}`+"\n\n")
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n")
	}
}

const (
	storyPrompt = "The quick brown fox jumps over the lazy dog while the children play in the park and the old man reads his newspaper on the wooden bench near the fountain."
	storyAnswer = " Then a small bird landed on the edge of the fountain and began to sing a song that nobody in the park had ever heard before."
)

func TestConversationMatchedByPromptPrefix(t *testing.T) {
	tok := fixtureTokenizer(t)
	if n := len(tok.Encode(storyPrompt+storyAnswer, true)); n < 64 {
		t.Fatalf("the test history is %d tokens, want at least 64", n)
	}
	for _, tt := range []struct {
		name   string
		path   string
		stream bool
		turn1  string // the body of turn 1 and of turn 2 (%s: the answer)
		turn2  string
	}{
		{"completions", "/v1/completions", false,
			`{"prompt":%q}`, `{"prompt":%q}`},
		{"completions, streamed", "/v1/completions", true,
			`{"prompt":%q,"stream":true}`, `{"prompt":%q,"stream":true}`},
		{"chat", "/v1/chat/completions", false,
			`{"messages":[{"role":"user","content":%q}]}`, `{"messages":[{"role":"user","content":%q},{"role":"assistant","content":%q},{"role":"user","content":"And then?"}]}`},
		{"chat, streamed", "/v1/chat/completions", true,
			`{"messages":[{"role":"user","content":%q}],"stream":true}`, `{"messages":[{"role":"user","content":%q},{"role":"assistant","content":%q},{"role":"user","content":"And then?"}],"stream":true}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pre := newFake(t, prefillOK)
			decs := []*fakeEngine{newFake(t, answeringDecode("0", storyAnswer, 1000)), newFake(t, answeringDecode("1", storyAnswer, 1000))}
			p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok}, []*fakeEngine{pre}, decs)
			resp, _ := post(t, url, tt.path, fmt.Sprintf(tt.turn1, storyPrompt), nil)
			first := whichGot(decs, resp.Header.Get("X-Request-Id"))
			if got := metricValue(t, p, "tandem:proxy_conversations", nil); got != 1 {
				t.Fatalf("%v turns remembered after turn 1, want 1 (by its history)", got)
			}
			var body2 string
			if strings.Contains(tt.turn2, "And then") {
				body2 = fmt.Sprintf(tt.turn2, storyPrompt, storyAnswer)
			} else {
				body2 = fmt.Sprintf(tt.turn2, storyPrompt+storyAnswer+" The end.")
			}
			resp, got := post(t, url, tt.path, body2, nil)
			if resp.StatusCode != 200 || strings.Contains(got, kvParamsKey) {
				t.Fatalf("turn 2: %d %s", resp.StatusCode, got)
			}
			if second := whichGot(decs, resp.Header.Get("X-Request-Id")); second != first {
				t.Errorf("turn 2 went to decode %d, turn 1 to %d: want the decode holding the history", second, first)
			}
			plegs := pre.requests()
			if got, want := prefillKVOf(t, plegs[1]), strings.Replace(decodeKV(fmt.Sprint(first), 0), `"remote_num_tokens":4.0e1`, `"remote_num_tokens":1000`, 1); !strings.HasPrefix(got, want[:strings.Index(want, `"remote_blocks_expiry_time"`)]) {
				t.Errorf("turn 2's prefill leg carried %s, want decode %d's params", got, first)
			}
			for name, want := range map[string]float64{
				"tandem:proxy_conversation_prefix_lookups_total{result=miss}": 1,
				"tandem:proxy_conversation_prefix_lookups_total{result=hit}":  1,
				"tandem:proxy_conversation_history_prefills_total":            1,
				"tandem:proxy_conversation_params_stored_total":               2,
				"tandem:proxy_conversation_lookups_total{result=hit}":         0,
			} {
				metric, labels := splitMetric(name)
				if got := metricValue(t, p, metric, labels); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			if n := len(releases(decs[0])) + len(releases(decs[1])); n != 0 {
				t.Errorf("%d holds released: turn 1's was pulled, turn 2's is remembered", n)
			}
		})
	}

	t.Run("what does not match", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, storyPrompt), nil)
		ids := tok.Encode(storyPrompt, true)
		for _, prompt := range []string{
			"A different story altogether, about a ship and the sea and a sailor who never came home to his family.",
			tok.Decode(ids[:40], true) + " but then everything changed.", // 2 blocks of 16 in common: under 64 tokens
		} {
			post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt), nil)
		}
		for i, r := range pre.requests() {
			if got := prefillKVOf(t, r); got != string(prefillKVParams) {
				t.Errorf("prefill leg %d carried %s, want no history", i, got)
			}
		}
		if got := metricValue(t, p, "tandem:proxy_conversation_prefix_lookups_total", map[string]string{"result": "miss"}); got != 3 {
			t.Errorf("prefix misses %v, want 3", got)
		}
	})

	t.Run("an edited history matches its leading blocks", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, storyPrompt), nil)
		edited := storyPrompt + strings.Replace(storyAnswer, "small bird", "large crow", 1)
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, edited), nil)
		if got := prefillKVOf(t, pre.requests()[1]); !strings.Contains(got, `"remote_engine_id":"d-0"`) {
			t.Errorf("the edited turn's prefill leg carried %s, want the history (the prefill pulls what agrees)", got)
		}
		if got := metricValue(t, p, "tandem:proxy_conversation_prefix_lookups_total", map[string]string{"result": "partial"}); got != 1 {
			t.Errorf("partial prefix hits %v, want 1", got)
		}
	})

	t.Run("the history is cut to the tokens the decode holds", func(t *testing.T) {
		held := len(tok.Encode(storyPrompt, true)) + 10 // a decode that held 10 answer tokens
		pre := newFake(t, prefillOK)
		dec := newFake(t, answeringDecode("0", storyAnswer, held))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, storyPrompt), nil)
		// A prompt with the held tokens' whole blocks, and not the rest of
		// the answer, has all of the history.
		ids := tok.Encode(storyPrompt+storyAnswer, true)
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, tok.Decode(ids[:held/16*16], true)+" and more"), nil)
		if got := prefillKVOf(t, pre.requests()[1]); !strings.Contains(got, `"remote_engine_id":"d-0"`) {
			t.Errorf("turn 2's prefill leg carried %s, want the history", got)
		}
		if got := metricValue(t, p, "tandem:proxy_conversation_prefix_lookups_total", map[string]string{"result": "hit"}); got != 1 {
			t.Errorf("prefix hits %v, want 1: the history is the held tokens' blocks", got)
		}
	})

	t.Run("answers that are not one continuation are not remembered", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok}, []*fakeEngine{pre}, []*fakeEngine{dec})
		for _, extra := range []string{`"n":2`, `"best_of":3`, `"echo":true`, `"prompt_logprobs":null,"suffix":"x"`} {
			post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q,%s}`, storyPrompt, extra), nil)
		}
		post(t, url, "/v1/completions", `{"prompt":[1,2,3]}`, nil) // token ids: the router does not tokenize them
		waitReleases(t, dec, 5)
		if got := metricValue(t, p, "tandem:proxy_conversations", nil); got != 0 {
			t.Errorf("%v turns remembered", got)
		}
	})

	t.Run("evicted and superseded histories are released", func(t *testing.T) {
		pre := newFake(t, prefillOK)
		dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
		p, url := startProxy(t, Config{Fallback: true, Conversations: true, Tokenizer: tok, ConversationMaxEntries: 1}, []*fakeEngine{pre}, []*fakeEngine{dec})
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, storyPrompt), nil)
		post(t, url, "/v1/completions", `{"prompt":"A different story altogether, about a ship and the sea and a sailor who never came home to his family and his dog and his old house by the harbour."}`, nil)
		waitReleases(t, dec, 1)
		waitFor(t, func() bool {
			return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": "conversation_evicted", "result": "released"}) == 1
		})
		if got := metricValue(t, p, "tandem:proxy_conversation_evictions_total", map[string]string{"reason": "capacity"}); got != 1 {
			t.Errorf("capacity evictions %v, want 1", got)
		}
	})
}

func TestConversationPrefixMatchingOffWithoutTokenizer(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	pre := newFake(t, prefillOK)
	dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
	p, url := startProxy(t, Config{Fallback: true, Conversations: true, Logger: log}, []*fakeEngine{pre}, []*fakeEngine{dec})
	for range 2 {
		post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, storyPrompt+storyAnswer), nil)
	}
	waitReleases(t, dec, 2)
	if got := prefillKVOf(t, pre.requests()[1]); got != string(prefillKVParams) {
		t.Errorf("turn 2's prefill leg carried %s without a tokenizer", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "automatic matching by prompt prefix is off"); n != 1 {
		t.Errorf("the log says %d times that prefix matching is off, want once:\n%s", n, logs.String())
	}
	if got := metricValue(t, p, "tandem:proxy_conversation_prefix_lookups_total", map[string]string{"result": "miss"}); got != 0 {
		t.Errorf("prefix lookups counted with matching off: %v", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestStoppingProxyReleasesRememberedHolds(t *testing.T) {
	tok := fixtureTokenizer(t)
	pre := newFake(t, prefillOK)
	dec := newFake(t, answeringDecode("0", storyAnswer, 1000))
	p, err := New(Config{Prefill: []string{pre.URL()}, Decode: []string{dec.URL()}, Fallback: true, Conversations: true, Tokenizer: tok,
		Logger: discardLogger(), HealthInterval: time.Hour, ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	waitFor(t, func() bool { return p.Ready() })
	post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"conversation_id":"c"}`, storyPrompt), nil)
	post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, "Another story: "+storyPrompt), nil)
	if len(releases(dec)) != 0 {
		t.Fatal("a hold was released before the proxy stopped")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if n := len(releases(dec)); n != 2 {
		t.Errorf("%d holds released when the proxy stopped, want both remembered turns'", n)
	}
	if got := metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": "proxy_stopped", "result": "released"}); got != 2 {
		t.Errorf("releases{proxy_stopped} = %v, want 2", got)
	}
}

// TestClientLeavingAfterTheParamsReleasesTheHold: a client that hangs up
// after the chunk carrying the decode's params (before [DONE]) does not
// leave the hold to its expiry.
func TestClientLeavingAfterTheParamsReleasesTheHold(t *testing.T) {
	kv := decodeKV("0", float64(time.Now().Add(time.Hour).Unix()))
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/tandem/kv/release" {
			io.WriteString(w, `{"released":true}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, turnSSEFirst)
		io.WriteString(w, strings.Replace(turnSSELast, `}]}`, `}],"kv_transfer_params":`+kv+`}`, 1))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // [DONE] never comes
	})
	_, url := startProxy(t, Config{Fallback: true, Conversations: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true,"conversation_id":"c"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(`"finish_reason":"stop"`)) {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("stream ended before the last chunk: %v (%q)", err, got)
		}
	}
	resp.Body.Close()
	if rel := waitReleases(t, dec, 1); rel[0].Body != `{"kv_transfer_params":`+kv+`}` {
		t.Errorf("release %s", rel[0].Body)
	}
}
