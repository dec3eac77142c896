package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// storyPrompt is long enough to fill a few KV blocks (16 tokens each), so
// the choices after the first find them in the prefix cache.
const storyPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends."

func completionOK(t *testing.T, url, body string) CompletionResponse {
	t.Helper()
	resp, raw := post(t, url+"/v1/completions", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var r CompletionResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func choiceTexts(r CompletionResponse) []string {
	out := make([]string, len(r.Choices))
	for i, c := range r.Choices {
		if c.Index != i {
			return []string{fmt.Sprintf("choice %d has index %d", i, c.Index)}
		}
		out[i] = c.Text
	}
	return out
}

// streamTexts reads an SSE completion or chat stream and reassembles each
// choice's text by index; it returns them and the usage chunk, if any.
func streamTexts(t *testing.T, body []byte, chat bool) (map[int]string, map[int]string, *Usage) {
	t.Helper()
	texts, finishes := map[int]string{}, map[int]string{}
	var usage *Usage
	for _, data := range sseEvents(t, body) {
		if data == "[DONE]" {
			break
		}
		var c struct {
			Choices []struct {
				Index        int                        `json:"index"`
				Text         string                     `json:"text"`
				Delta        *struct{ Content *string } `json:"delta"`
				FinishReason *string                    `json:"finish_reason"`
			} `json:"choices"`
			Usage *Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			if chat {
				if ch.Delta != nil && ch.Delta.Content != nil {
					texts[ch.Index] += *ch.Delta.Content
				}
			} else {
				texts[ch.Index] += ch.Text
			}
			if ch.FinishReason != nil {
				finishes[ch.Index] = *ch.FinishReason
			}
		}
	}
	return texts, finishes, usage
}

func TestNChoicesWithStories260K(t *testing.T) {
	s := startStories(t, "stories260K")
	body := func(extra string) string {
		return fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":24%s}`, storyPrompt, extra)
	}

	t.Run("n=3 greedy gives three choices equal to n=1", func(t *testing.T) {
		one := completionOK(t, s.url, body(`,"temperature":0`))
		three := completionOK(t, s.url, body(`,"temperature":0,"n":3`))
		want := one.Choices[0].Text
		got := choiceTexts(three)
		if len(got) != 3 || got[0] != want || got[1] != want || got[2] != want {
			t.Errorf("n=3 greedy choices %q, want 3 × %q", got, want)
		}
		u := three.Usage
		if u.PromptTokens != one.Usage.PromptTokens || u.CompletionTokens != 3*one.Usage.CompletionTokens ||
			u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v: want the prompt once (%d) and three completions (%d each)", *u, one.Usage.PromptTokens, one.Usage.CompletionTokens)
		}
	})

	t.Run("n=3 with a seed gives the n=1 answers of seeds s, s+1, s+2", func(t *testing.T) {
		const seed = 1234
		var want []string
		for i := range 3 {
			r := completionOK(t, s.url, body(fmt.Sprintf(`,"temperature":1,"seed":%d`, seed+i)))
			want = append(want, r.Choices[0].Text)
		}
		if want[0] == want[1] && want[1] == want[2] {
			t.Fatalf("three seeds gave the same text %q: the test cannot tell choices apart", want[0])
		}
		got := choiceTexts(completionOK(t, s.url, body(fmt.Sprintf(`,"temperature":1,"seed":%d,"n":3`, seed))))
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("n=3 seeded choices\n got %q\nwant %q", got, want)
		}

		t.Run("streaming n=2 reassembles to the same choices", func(t *testing.T) {
			resp, raw := post(t, s.url+"/v1/completions", body(fmt.Sprintf(`,"temperature":1,"seed":%d,"n":2,"stream":true,"stream_options":{"include_usage":true}`, seed)), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			texts, finishes, usage := streamTexts(t, raw, false)
			if len(texts) != 2 || texts[0] != want[0] || texts[1] != want[1] {
				t.Errorf("streamed choices %v, want %q", texts, want[:2])
			}
			two := completionOK(t, s.url, body(fmt.Sprintf(`,"temperature":1,"seed":%d,"n":2`, seed)))
			if len(finishes) != 2 || usage == nil || *usage != *two.Usage {
				t.Errorf("finishes %v, usage %+v; want 2 finishes and the usage %+v of the same request unstreamed", finishes, usage, *two.Usage)
			}
		})
	})

	t.Run("the extra choices hit the prefix cache", func(t *testing.T) {
		queriesBefore := testutil.Metric(t, s.url, "vllm:prefix_cache_queries", "")
		hitsBefore := testutil.Metric(t, s.url, "vllm:prefix_cache_hits", "")
		// A prompt no other subtest sent, so only this request's own
		// choices can hit.
		r := completionOK(t, s.url, fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8,"temperature":0,"n":4}`, "The sun was hot and the dog ran to the big red barn to find his friend the cat, who was asleep."))
		full := (r.Usage.PromptTokens - 1) / 16 * 16 // the full blocks a hit may cover
		if full < 16 {
			t.Fatalf("prompt of %d tokens fills no block", r.Usage.PromptTokens)
		}
		// The engine publishes the counters after the step that answered,
		// so they may lag the response a little (on a loaded machine, a
		// lot: the wait is bounded by a deadline, not a count of polls).
		var hits, queries float64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			hits = testutil.Metric(t, s.url, "vllm:prefix_cache_hits", "") - hitsBefore
			queries = testutil.Metric(t, s.url, "vllm:prefix_cache_queries", "") - queriesBefore
			if hits == float64(3*full) && queries == float64(4*r.Usage.PromptTokens) || time.Now().After(deadline) {
				break
			}
		}
		if hits != float64(3*full) || queries != float64(4*r.Usage.PromptTokens) {
			t.Errorf("prefix cache: %v hits of %v queried tokens; want the 3 extra choices to hit %d tokens each of %d", hits, queries, full, r.Usage.PromptTokens)
		}
		if r.Usage.PromptTokensDetails.CachedTokens != 0 {
			t.Errorf("cached_tokens %d: the first choice computed the prompt", r.Usage.PromptTokensDetails.CachedTokens)
		}
	})

	t.Run("several prompts with n=2 index choices prompt by prompt", func(t *testing.T) {
		a := completionOK(t, s.url, `{"model":"stories260K","prompt":"Once upon a time","max_tokens":6,"temperature":0}`).Choices[0].Text
		b := completionOK(t, s.url, `{"model":"stories260K","prompt":"The cat","max_tokens":6,"temperature":0}`).Choices[0].Text
		r := completionOK(t, s.url, `{"model":"stories260K","prompt":["Once upon a time","The cat"],"max_tokens":6,"temperature":0,"n":2}`)
		if got, want := choiceTexts(r), []string{a, a, b, b}; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("choices %q, want %q", got, want)
		}
	})

	t.Run("echo prepends the prompt", func(t *testing.T) {
		plain := completionOK(t, s.url, `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}`).Choices[0].Text
		r := completionOK(t, s.url, `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0,"echo":true,"n":2}`)
		if got := choiceTexts(r); len(got) != 2 || got[0] != "Once upon a time"+plain || got[1] != got[0] {
			t.Errorf("echo choices %q, want 2 × %q", got, "Once upon a time"+plain)
		}
		resp, raw := post(t, s.url+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0,"echo":true,"stream":true}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		events := sseEvents(t, raw)
		if !strings.Contains(events[0], `"text":"Once upon a time`) {
			t.Errorf("first chunk %s does not carry the prompt", events[0])
		}
		if texts, _, _ := streamTexts(t, raw, false); texts[0] != "Once upon a time"+plain {
			t.Errorf("streamed echo %q", texts[0])
		}
		t.Run("token prompts echo their text", func(t *testing.T) {
			tok := loaded.Stories(t).Tokenizer
			ids, _ := json.Marshal(tok.Encode("Once upon a time", true))
			r := completionOK(t, s.url, `{"model":"stories260K","prompt":`+string(ids)+`,"max_tokens":8,"temperature":0,"echo":true}`)
			if r.Choices[0].Text != "Once upon a time"+plain {
				t.Errorf("echo of token ids %q", r.Choices[0].Text)
			}
		})
	})

	t.Run("a client that disconnects aborts every choice", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":400,"ignore_eos":true,"n":3,"stream":true}`, storyPrompt)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// Wait until every choice has streamed something, so all three
		// are in the engine when the client goes.
		seen := map[int]bool{}
		sc := bufio.NewScanner(resp.Body)
		for len(seen) < 3 && sc.Scan() {
			var c CompletionChunk
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && json.Unmarshal([]byte(data), &c) == nil {
				for _, ch := range c.Choices {
					seen[ch.Index] = true
				}
			}
		}
		if len(seen) < 3 {
			t.Fatalf("the stream ended before every choice started: %v", seen)
		}
		cancel()
		resp.Body.Close()
		testutil.WaitFor(t, "the pool to be full again", 5*time.Second, func() bool {
			st := s.eng.Stats()
			return st.FreeBlocks == st.TotalBlocks && st.Running == 0 && st.Waiting == 0
		})
	})
}

// storiesTemplate is the plain story template the embedded default model
// ships (internal/defaultmodel), which the shared test model lacks.
func storiesTemplate(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "defaultmodel", "stories260K", "chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestChatTemplateOverrideWithStories260K(t *testing.T) {
	tok := loaded.Stories(t).Tokenizer
	if tok.HasChatTemplate() {
		t.Fatalf("the shared stories260K model has a chat template; this test wants one without")
	}
	src := storiesTemplate(t)
	chat, err := ChatTemplateFor(tok, src)
	if err != nil {
		t.Fatal(err)
	}
	s := startStories(t, "stories260K", func(c *Config) {
		c.ChatTemplate = chat
		c.RequestChatTemplate = RequestChatTemplates(tok)
	})
	conv := `[{"role":"system","content":"You tell stories."},{"role":"user","content":"Tom had a red ball."},{"role":"assistant","content":"He threw it to his dog."},{"role":"user","content":"The dog ran after it."}]`
	// The template renders BOS, then each non-system message as a paragraph,
	// then the newline that asks for the next one.
	const rendered = "Tom had a red ball.\nHe threw it to his dog.\nThe dog ran after it.\n"

	chatBody := func(extra string) string {
		return `{"model":"stories260K","messages":` + conv + `,"max_tokens":24,"temperature":0` + extra + `}`
	}
	t.Run("a multi-turn chat renders and generates what the completion of its rendering does", func(t *testing.T) {
		resp, raw := post(t, s.url+"/v1/chat/completions", chatBody(""), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		var r ChatCompletionResponse
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		want := completionOK(t, s.url, fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":24,"temperature":0}`, rendered))
		if len(r.Choices) != 1 || r.Choices[0].Message.Content != want.Choices[0].Text || r.Choices[0].Message.Content == "" {
			t.Errorf("chat answer %+v, want the completion of the rendered prompt %q", r.Choices, want.Choices[0].Text)
		}
		if r.Usage.PromptTokens != want.Usage.PromptTokens {
			t.Errorf("chat prompt tokens %d, completion of the rendering %d", r.Usage.PromptTokens, want.Usage.PromptTokens)
		}

		t.Run("n=2 streams both choices, each with its role first", func(t *testing.T) {
			resp, raw := post(t, s.url+"/v1/chat/completions", chatBody(`,"n":2,"stream":true`), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			events := sseEvents(t, raw)
			for i := range 2 {
				if !strings.Contains(events[i], `"index":`+strconv.Itoa(i)+`,"delta":{"role":"assistant"`) {
					t.Errorf("event %d %s: want choice %d's role", i, events[i], i)
				}
			}
			texts, finishes, _ := streamTexts(t, raw, true)
			if texts[0] != r.Choices[0].Message.Content || texts[1] != texts[0] || len(finishes) != 2 {
				t.Errorf("streamed %v finishes %v, want 2 × %q", texts, finishes, r.Choices[0].Message.Content)
			}
		})
	})

	t.Run("tokenize renders with the template", func(t *testing.T) {
		_, raw := post(t, s.url+"/tokenize", `{"messages":`+conv+`}`, nil)
		var tr TokenizeResponse
		if err := json.Unmarshal(raw, &tr); err != nil {
			t.Fatal(err)
		}
		if want := tok.Encode(rendered, true); fmt.Sprint(tr.Tokens) != fmt.Sprint(want) {
			t.Errorf("tokens %v, want %v", tr.Tokens, want)
		}
	})

	t.Run("a request's own chat_template renders that request", func(t *testing.T) {
		_, raw := post(t, s.url+"/tokenize", `{"messages":`+conv+`,"chat_template":"{{ bos_token }}{{ messages[-1]['content'] }}"}`, nil)
		var tr TokenizeResponse
		if err := json.Unmarshal(raw, &tr); err != nil {
			t.Fatal(err)
		}
		if want := tok.Encode("The dog ran after it.", true); fmt.Sprint(tr.Tokens) != fmt.Sprint(want) {
			t.Errorf("tokens %v, want %v", tr.Tokens, want)
		}
		resp, raw := post(t, s.url+"/v1/chat/completions", chatBody(`,"chat_template":"{% for"`), nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"chat_template"`) {
			t.Errorf("a template that does not compile: %d %s", resp.StatusCode, raw)
		}
	})
}

// TestNChoicesFailures drives n > 1 over a fake engine: a failing choice
// fails the request and aborts the others, and a prefill leg is one choice.
func TestNChoicesFailures(t *testing.T) {
	t.Run("a choice that fails fails the request and the others are aborted", func(t *testing.T) {
		b := newFakeBackend(func(r *engine.Request) []engine.Event {
			if r.Params.Seed == 8 { // choice 1 of seed 7
				return []engine.Event{{Tokens: []int32{70}, Text: "C"}, {Finish: engine.FinishError, Err: io.ErrUnexpectedEOF}}
			}
			return []engine.Event{{Tokens: []int32{70}, Text: "C"}}
		})
		b.hold = true
		_, ts := newTestServer(t, b, nil)
		resp, raw := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":4,"n":3,"seed":7}`, nil)
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(raw), "unexpected EOF") {
			t.Errorf("status %d: %s", resp.StatusCode, raw)
		}
		b.waitIdle(t)
		// Choices 0 and 1 always run; choice 2 is submitted only if
		// choice 1's failure has not closed the run yet (both orders
		// happen), and a run closed by a failure starts nothing more.
		reqs := b.requests()
		if len(reqs) < 2 || len(reqs) > 3 {
			t.Fatalf("%d requests submitted, want choices 0 and 1, and 2 at most once", len(reqs))
		}
		b.mu.Lock()
		aborted := map[string]bool{}
		for _, id := range b.aborted {
			aborted[id] = true
		}
		b.mu.Unlock()
		for i, r := range reqs {
			if r.Params.Seed != uint64(7+i) {
				t.Errorf("choice %d has seed %d", i, r.Params.Seed)
			}
			if r.Params.Seed != 8 && !aborted[r.ID] {
				t.Errorf("choice %d (%s) still running was not aborted; aborted %v", i, r.ID, aborted)
			}
		}
	})

	t.Run("a first choice that fails before its first token starts no others", func(t *testing.T) {
		b := newFakeBackend(func(r *engine.Request) []engine.Event {
			return []engine.Event{{Finish: engine.FinishError, Err: io.ErrUnexpectedEOF}}
		})
		_, ts := newTestServer(t, b, nil)
		resp, _ := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}],"n":4,"stream":true}`, nil)
		if resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("status %d", resp.StatusCode)
		}
		b.waitIdle(t)
		if n := len(b.requests()); n != 1 {
			t.Errorf("%d requests submitted, want only the first choice", n)
		}
	})

	t.Run("only the first choice carries kv_transfer_params", func(t *testing.T) {
		b := newFakeBackend(echoScript("hi"))
		_, ts := newTestServer(t, b, nil)
		resp, raw := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":2,"n":3,"kv_transfer_params":{"do_remote_prefill":true}}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		b.waitIdle(t)
		reqs := b.requests()
		if len(reqs) != 3 || reqs[0].KVTransfer == nil || reqs[1].KVTransfer != nil || reqs[2].KVTransfer != nil {
			t.Errorf("kv_transfer_params per choice: %d requests, %v", len(reqs), reqs)
		}
	})

	t.Run("a prefill leg with n > 1 runs one choice", func(t *testing.T) {
		b := newFakeBackend(func(r *engine.Request) []engine.Event {
			return []engine.Event{{Tokens: []int32{70}, Text: "C", Finish: engine.FinishLength, KVTransfer: json.RawMessage(`{"remote_block_ids":[[1]]}`)}}
		})
		_, ts := newTestServer(t, b, nil)
		resp, raw := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":1,"n":3,"kv_transfer_params":{"do_remote_decode":true}}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		var r CompletionResponse
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		b.waitIdle(t)
		if len(r.Choices) != 1 || r.KVTransferParams == nil || len(b.requests()) != 1 {
			t.Errorf("prefill leg: %d choices, %d requests, %s", len(r.Choices), len(b.requests()), raw)
		}
	})
}
