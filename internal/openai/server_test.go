package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func post(t *testing.T, url, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestBadRequests(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, func(c *Config) { c.MaxBodyBytes = 4096 })
	noTemplate := newFakeBackend(echoScript("x"))
	_, tsNoTemplate := newTestServer(t, noTemplate, func(c *Config) { c.ChatTemplate = nil })

	cases := []struct {
		name   string
		url    string
		method string
		body   string
		status int
		typ    string
		param  string
		msg    string // substring of the message
	}{
		{"invalid JSON is a 400", "/v1/completions", "POST", `{"model":`, 400, TypeBadRequest, "", "invalid JSON"},
		{"an empty body is a 400", "/v1/completions", "POST", ``, 400, TypeBadRequest, "", "empty"},
		{"a JSON array body is a 400", "/v1/completions", "POST", `[1]`, 400, TypeBadRequest, "", "JSON object"},
		{"a string max_tokens names the field", "/v1/completions", "POST", `{"model":"m","prompt":"a","max_tokens":"5"}`, 400, TypeBadRequest, "max_tokens", "expected integer"},
		{"a string temperature names the field", "/v1/completions", "POST", `{"model":"m","prompt":"a","temperature":"hot"}`, 400, TypeBadRequest, "temperature", "expected number"},
		{"a numeric stream names the field", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"stream":1}`, 400, TypeBadRequest, "stream", "expected boolean"},
		{"a nested wrong type names the path", "/v1/completions", "POST", `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}`, 400, TypeBadRequest, "stream_options.include_usage", ""},
		{"max_tokens 0 is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","max_tokens":0}`, 400, TypeBadRequest, "max_tokens", "at least 1"},
		{"prompt plus max_tokens beyond the context says both numbers", "/v1/completions", "POST", `{"model":"m","prompt":"abc","max_tokens":100}`, 400, TypeBadRequest, "max_tokens", "maximum context length is 64 tokens. However, you requested 104 tokens (4 in the prompt, 100 in the completion)"},
		{"a prompt that fills the context is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"` + strings.Repeat("a", 70) + `"}`, 400, TypeBadRequest, "prompt", "71 tokens"},
		{"chat max_completion_tokens beyond the context", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":1000}`, 400, TypeBadRequest, "max_completion_tokens", "1000 in the completion"},
		{"an empty token list is a 400", "/v1/completions", "POST", `{"model":"m","prompt":[]}`, 400, TypeBadRequest, "prompt", "empty"},
		{"an empty prompt in a batch names its index", "/v1/completions", "POST", `{"model":"m","prompt":[[1],[]]}`, 400, TypeBadRequest, "prompt[1]", "empty"},
		{"a missing prompt is a 400", "/v1/completions", "POST", `{"model":"m"}`, 400, TypeBadRequest, "prompt", "required"},
		{"a prompt of objects is a 400", "/v1/completions", "POST", `{"model":"m","prompt":{"a":1}}`, 400, TypeBadRequest, "prompt", "must be a string"},
		{"a token id outside the vocabulary is a 400", "/v1/completions", "POST", `{"model":"m","prompt":[1,9999]}`, 400, TypeBadRequest, "prompt", "9999"},
		{"n 0 is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","n":0}`, 400, TypeBadRequest, "n", "between 1 and 128, got 0"},
		{"n above the cap is a 400", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"n":129}`, 400, TypeBadRequest, "n", "between 1 and 128, got 129"},
		{"best_of above n is a 400, not ignored", "/v1/completions", "POST", `{"model":"m","prompt":"a","n":2,"best_of":3}`, 400, TypeBadRequest, "best_of", "best_of must equal n (2), got 3"},
		{"best_of without n is compared with n 1", "/v1/completions", "POST", `{"model":"m","prompt":"a","best_of":2}`, 400, TypeBadRequest, "best_of", "best_of must equal n (1)"},
		{"echo with logprobs is a 400: no prompt logprobs", "/v1/completions", "POST", `{"model":"m","prompt":"a","echo":true,"logprobs":1}`, 400, TypeBadRequest, "echo", "prompt's logprobs"},
		{"a request chat_template is refused unless trusted", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"chat_template":"{{ 'x' }}"}`, 400, TypeBadRequest, "chat_template", "--trust-request-chat-template"},
		{"tokenize refuses an untrusted chat_template too", "/tokenize", "POST", `{"messages":[{"role":"user","content":"a"}],"chat_template":"{{ 'x' }}"}`, 400, TypeBadRequest, "chat_template", "--trust-request-chat-template"},
		{"logprobs above 20 is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","logprobs":21}`, 400, TypeBadRequest, "logprobs", "between 0 and 20"},
		{"top_logprobs without logprobs is a 400", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"top_logprobs":2}`, 400, TypeBadRequest, "top_logprobs", "logprobs"},
		{"top_p 0 is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","top_p":0}`, 400, TypeBadRequest, "top_p", "(0, 1]"},
		{"a negative temperature is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","temperature":-1}`, 400, TypeBadRequest, "temperature", ""},
		{"presence_penalty above 2 is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","presence_penalty":3}`, 400, TypeBadRequest, "presence_penalty", ""},
		{"a logit_bias key that is not a token id is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","logit_bias":{"x":1}}`, 400, TypeBadRequest, "logit_bias", "token ids"},
		{"a logit_bias token outside the vocabulary is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","logit_bias":{"100000":1}}`, 400, TypeBadRequest, "logit_bias", ""},
		{"min_tokens above max_tokens is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","max_tokens":2,"min_tokens":3}`, 400, TypeBadRequest, "min_tokens", ""},
		{"a stop of numbers is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","stop":[1]}`, 400, TypeBadRequest, "stop", ""},
		{"stream_options without stream is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","stream_options":{"include_usage":true}}`, 400, TypeBadRequest, "stream_options", "stream"},
		{"kv_transfer_params must be an object", "/v1/completions", "POST", `{"model":"m","prompt":"a","kv_transfer_params":[1]}`, 400, TypeBadRequest, "kv_transfer_params", "object"},
		{"streaming a prefill leg is a 400", "/v1/completions", "POST", `{"model":"m","prompt":"a","stream":true,"kv_transfer_params":{"do_remote_decode":true}}`, 400, TypeBadRequest, "kv_transfer_params", "the proxy calls the prefill engine with stream=false"},
		{"streaming a chat prefill leg is a 400", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":"a"}],"stream":true,"kv_transfer_params":{"do_remote_decode":true}}`, 400, TypeBadRequest, "kv_transfer_params", "stream=false"},
		{"kv_transfer_params with several prompts is a 400", "/v1/completions", "POST", `{"model":"m","prompt":["a","b"],"kv_transfer_params":{"do_remote_decode":true}}`, 400, TypeBadRequest, "kv_transfer_params", "2 prompts"},
		{"an unknown model is vLLM's 404", "/v1/completions", "POST", `{"model":"other","prompt":"a"}`, 404, TypeNotFound, "model", "`other` does not exist. This server serves \"m\""},
		{"empty messages is a 400", "/v1/chat/completions", "POST", `{"model":"m","messages":[]}`, 400, TypeBadRequest, "messages", "empty"},
		{"an unknown role names the message", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"wizard","content":"a"}]}`, 400, TypeBadRequest, "messages[0].role", "wizard"},
		{"an image part names the part", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`, 400, TypeBadRequest, "messages[0].content[1].type", "image_url"},
		{"numeric content is a 400", "/v1/chat/completions", "POST", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, TypeBadRequest, "messages[0].content", ""},
		{"an unknown route is a JSON 404", "/v1/embeddings", "POST", `{}`, 404, TypeNotFound, "", "no route"},
		{"GET on completions is a JSON 405", "/v1/completions", "GET", ``, 405, TypeMethodNotAllowed, "", "use POST"},
		{"POST on models is a JSON 405", "/v1/models", "POST", `{}`, 405, TypeMethodNotAllowed, "", "use GET"},
		{"a body over the limit is a 413", "/v1/completions", "POST", `{"model":"m","prompt":"` + strings.Repeat("a", 5000) + `"}`, 413, TypeTooLarge, "", "4096 bytes"},
		{"detokenize of an out-of-vocabulary id is a 400", "/detokenize", "POST", `{"tokens":[-1]}`, 400, TypeBadRequest, "tokens", ""},
		{"tokenize with neither prompt nor messages is a 400", "/tokenize", "POST", `{}`, 400, TypeBadRequest, "prompt", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, ts.URL+c.url, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkError(t, resp, c.status, c.typ, c.param, c.msg)
		})
	}
	t.Run("chat without a chat template says to use completions", func(t *testing.T) {
		resp, _ := post(t, tsNoTemplate.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}]}`, nil)
		_ = resp
		req, _ := http.NewRequest("POST", tsNoTemplate.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"a"}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		checkError(t, resp, 400, TypeBadRequest, "messages", "model m has no chat template; use /v1/completions, or start the server with --chat-template")
	})
	if got := b.requests(); len(got) != 0 {
		t.Errorf("bad requests reached the engine: %d submitted", len(got))
	}
}

// checkError checks an error response's status and body.
func checkError(t *testing.T, resp *http.Response, status int, typ, param, msg string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	gotParam := ""
	if e.Error.Param != nil {
		gotParam = *e.Error.Param
	}
	if e.Error.Type != typ || gotParam != param || e.Error.Code != status {
		t.Errorf("type %q param %q code %d, want %q %q %d (message %q)", e.Error.Type, gotParam, e.Error.Code, typ, param, status, e.Error.Message)
	}
	if !strings.Contains(e.Error.Message, msg) {
		t.Errorf("message %q does not contain %q", e.Error.Message, msg)
	}
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]: %q", body)
	}
	var out []string
	for ev := range strings.SplitSeq(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		if !strings.HasPrefix(ev, "data: ") || strings.Contains(ev, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, strings.TrimPrefix(ev, "data: "))
	}
	return out
}

func TestChatStreamFormat(t *testing.T) {
	b := newFakeBackend(echoScript("hi"))
	_, ts := newTestServer(t, b, nil)
	resp, body := post(t, ts.URL+"/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}`,
		map[string]string{"X-Request-Id": "r1"})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	const head = `{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":`
	want := []string{
		head + `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`,
		head + `[{"index":0,"delta":{"content":"h"},"logprobs":null,"finish_reason":null}],"usage":null}`,
		head + `[{"index":0,"delta":{"content":"i"},"logprobs":null,"finish_reason":null}],"usage":null}`,
		head + `[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}`,
		head + `[],"usage":{"prompt_tokens":18,"completion_tokens":2,"total_tokens":20,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`[DONE]`,
	}
	if diff := cmp.Diff(want, sseEvents(t, body)); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
}

func TestCompletionStreamFormat(t *testing.T) {
	b := newFakeBackend(echoScript("hey"))
	_, ts := newTestServer(t, b, nil)
	t.Run("without include_usage no chunk has a usage field", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"x","stream":true,"max_tokens":2}`, map[string]string{"X-Request-Id": "c1"})
		const head = `{"id":"cmpl-c1","object":"text_completion","created":1700000000,"model":"m","choices":`
		want := []string{
			head + `[{"index":0,"text":"h","logprobs":null,"finish_reason":null,"stop_reason":null}]}`,
			head + `[{"index":0,"text":"e","logprobs":null,"finish_reason":null,"stop_reason":null}]}`,
			head + `[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
			`[DONE]`,
		}
		if diff := cmp.Diff(want, sseEvents(t, body)); diff != "" {
			t.Errorf("stream (-want +got):\n%s", diff)
		}
	})
	t.Run("several prompts stream as indexed choices with summed usage", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":["x","y"],"stream":true,"max_tokens":1,"stream_options":{"include_usage":true}}`, nil)
		evs := sseEvents(t, body)
		texts := map[int]string{}
		finishes := map[int]string{}
		var usage *Usage
		for _, ev := range evs[:len(evs)-1] {
			var c struct {
				Choices []CompletionChoice `json:"choices"`
				Usage   *Usage             `json:"usage"`
			}
			if err := json.Unmarshal([]byte(ev), &c); err != nil {
				t.Fatal(err)
			}
			for _, ch := range c.Choices {
				texts[ch.Index] += ch.Text
				if ch.FinishReason != nil {
					finishes[ch.Index] = *ch.FinishReason
				}
			}
			if c.Usage != nil {
				usage = c.Usage
			}
		}
		if diff := cmp.Diff(map[int]string{0: "h", 1: "h"}, texts); diff != "" {
			t.Errorf("texts (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[int]string{0: "length", 1: "length"}, finishes); diff != "" {
			t.Errorf("finish reasons (-want +got):\n%s", diff)
		}
		want := &Usage{PromptTokens: 4, CompletionTokens: 2, TotalTokens: 6, PromptTokensDetails: PromptTokensDetails{CachedTokens: 2}}
		if diff := cmp.Diff(want, usage); diff != "" {
			t.Errorf("usage (-want +got):\n%s", diff)
		}
	})
}

func TestNonStreamingResponses(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, nil)
	t.Run("completion with logprobs", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"ab","max_tokens":2,"logprobs":1}`, map[string]string{"X-Request-Id": "q"})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		want := `{"id":"cmpl-q","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"he","logprobs":{"tokens":["h","e"],"token_logprobs":[-0.5,-0.5],"top_logprobs":[{"a":-1,"h":-0.5},{"a":-1,"e":-0.5}],"text_offset":[0,1]},"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}`
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
	})
	t.Run("chat with top_logprobs", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_tokens":1,"logprobs":true,"top_logprobs":1}`, map[string]string{"X-Request-Id": "q"})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		want := `{"id":"chatcmpl-q","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"h"},"logprobs":{"content":[{"token":"h","logprob":-0.5,"bytes":[104],"top_logprobs":[{"token":"a","logprob":-1,"bytes":[97]}]}]},"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":20,"completion_tokens":1,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":1}}}`
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
		reqs := b.requests()
		if got, want := (byteTokenizer{}).Decode(reqs[len(reqs)-1].Prompt, false), "<user>a\nb<assistant>"; got != want {
			t.Errorf("rendered prompt %q, want %q (text parts joined by newlines, no BOS added)", got, want)
		}
	})
}

func TestRequestIDs(t *testing.T) {
	b := newFakeBackend(echoScript("ok"))
	_, ts := newTestServer(t, b, nil)
	cases := []struct {
		name   string
		header string
	}{
		{"a client id is echoed and prefixes the engine id", "client-7"},
		{"a missing id is generated and echoed", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{}
			if c.header != "" {
				h["X-Request-Id"] = c.header
			}
			resp, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, h)
			got := resp.Header.Get("X-Request-Id")
			if got == "" || (c.header != "" && got != c.header) {
				t.Fatalf("X-Request-Id %q, sent %q", got, c.header)
			}
			var r CompletionResponse
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			if r.ID != "cmpl-"+got {
				t.Errorf("response id %q, want cmpl-%s", r.ID, got)
			}
			reqs := b.requests()
			if id := reqs[len(reqs)-1].ID; !strings.HasPrefix(id, got+"-") {
				t.Errorf("engine id %q does not extend %q", id, got)
			}
		})
	}
	t.Run("the same id twice gives two distinct engine requests", func(t *testing.T) {
		for range 2 {
			post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, map[string]string{"X-Request-Id": "dup"})
		}
		reqs := b.requests()
		a, c := reqs[len(reqs)-2].ID, reqs[len(reqs)-1].ID
		if a == c {
			t.Errorf("both requests got engine id %q", a)
		}
	})
}

func TestKVTransferParams(t *testing.T) {
	out := map[string]any{"do_remote_prefill": true, "remote_block_ids": []any{[]any{1.0, 2.0}}, "remote_engine_id": "p0"}
	outJSON, _ := json.Marshal(out)
	b := newFakeBackend(func(r *engine.Request) []engine.Event {
		return []engine.Event{{Tokens: []int32{10}, Text: "x", Finish: engine.FinishLength, KVTransfer: outJSON, Usage: engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: 1}}}
	})
	_, ts := newTestServer(t, b, nil)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run("a prefill leg on "+path+" passes params in and returns the engine's", func(t *testing.T) {
			body := `{"model":"m","prompt":"a","max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"remote_engine_id":null}}`
			if path == "/v1/chat/completions" {
				body = `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"remote_engine_id":null}}`
			}
			resp, raw := post(t, ts.URL+path, body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			var r struct {
				KV map[string]any `json:"kv_transfer_params"`
			}
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(out, r.KV); diff != "" {
				t.Errorf("kv_transfer_params (-want +got):\n%s", diff)
			}
			reqs := b.requests()
			if diff := cmp.Diff(&kvparams.Params{DoRemoteDecode: true}, reqs[len(reqs)-1].KVTransfer); diff != "" {
				t.Errorf("engine got kv params (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("a streaming decode leg is accepted, and the engine's params ride on its final chunk only", func(t *testing.T) {
		resp, raw := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"a","stream":true,"kv_transfer_params":{"do_remote_prefill":true}}`, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		// A bidirectional decode returns its conversation hold with the
		// final event; the stream carries it where the finish_reason is.
		for line := range strings.SplitSeq(string(raw), "\n") {
			has := strings.Contains(line, "kv_transfer_params")
			final := strings.Contains(line, `"finish_reason":"length"`)
			if has != final {
				t.Errorf("kv_transfer_params on a chunk that is final=%v: %s", final, line)
			}
		}
	})
}

func TestEngineFailures(t *testing.T) {
	kvErr := errors.New("kv load from p0 failed: connection refused")
	cases := []struct {
		name   string
		script func(r *engine.Request) []engine.Event
		body   string
		status int
		want   string // non-streaming error message substring, or stream tail
	}{
		{
			name:   "a failure before any token is a 500 body",
			script: func(*engine.Request) []engine.Event { return []engine.Event{{Finish: engine.FinishError, Err: kvErr}} },
			body:   `{"model":"m","prompt":"a"}`,
			status: 500, want: "connection refused",
		},
		{
			name:   "a streaming failure before any token is still a 500 body",
			script: func(*engine.Request) []engine.Event { return []engine.Event{{Finish: engine.FinishError, Err: kvErr}} },
			body:   `{"model":"m","prompt":"a","stream":true}`,
			status: 500, want: "connection refused",
		},
		{
			name:   "an engine abort is a 503",
			script: func(*engine.Request) []engine.Event { return []engine.Event{{Finish: engine.FinishAbort}} },
			body:   `{"model":"m","prompt":"a"}`,
			status: 503, want: "aborted",
		},
		{
			name: "a failure mid-stream is an error chunk, then [DONE]",
			script: func(*engine.Request) []engine.Event {
				return []engine.Event{{Tokens: []int32{10}, Text: "x"}, {Finish: engine.FinishError, Err: kvErr}}
			},
			body:   `{"model":"m","prompt":"a","stream":true}`,
			status: 200, want: `data: {"error":{"message":"the request failed in the engine: kv load from p0 failed: connection refused","type":"InternalServerError","param":null,"code":500}}` + "\n\ndata: [DONE]\n\n",
		},
		{
			name:   "a stream that closes without a final event is an error",
			script: func(*engine.Request) []engine.Event { return []engine.Event{{Tokens: []int32{10}, Text: "x"}} },
			body:   `{"model":"m","prompt":"a","stream":true}`,
			status: 200, want: "without a final event",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, ts := newTestServer(t, newFakeBackend(c.script), nil)
			resp, body := post(t, ts.URL+"/v1/completions", c.body, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.status == 200 {
				if !strings.Contains(string(body), c.want) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
					t.Errorf("stream %q does not carry %q and end with [DONE]", body, c.want)
				}
				return
			}
			if !strings.Contains(string(body), c.want) {
				t.Errorf("body %s does not contain %q", body, c.want)
			}
		})
	}
}

func TestSubmitErrors(t *testing.T) {
	b := newFakeBackend(nil)
	b.err = &Error{Status: 503, Type: TypeUnavailable, Message: "engine is shutting down"}
	_, ts := newTestServer(t, b, nil)
	req, _ := http.NewRequest("POST", ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkError(t, resp, 503, TypeUnavailable, "", "shutting down")
}

func TestClientDisconnectAbortsRequest(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := "a non-streaming client that goes away aborts its request"
		if stream {
			name = "a streaming client that goes away mid-stream aborts its request"
		}
		t.Run(name, func(t *testing.T) {
			// One token, then the request runs until its context ends, as a
			// long generation would.
			b := newFakeBackend(func(*engine.Request) []engine.Event { return []engine.Event{{Tokens: []int32{10}, Text: "x"}} })
			b.hold = true
			_, ts := newTestServer(t, b, nil)
			body := `{"model":"m","prompt":"a","max_tokens":40}`
			if stream {
				body = `{"model":"m","prompt":"a","max_tokens":40,"stream":true}`
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if stream {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "data: ") {
					t.Fatalf("first line %q, %v", line, err)
				}
				cancel()
				resp.Body.Close()
			} else {
				done := make(chan error, 1)
				go func() {
					resp, err := http.DefaultClient.Do(req)
					if err == nil {
						resp.Body.Close()
					}
					done <- err
				}()
				testutil.WaitFor(t, "the request to reach the backend", 5*time.Second, func() bool { return len(b.requests()) > 0 })
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Fatalf("client got %v, want context.Canceled", err)
				}
			}
			b.waitIdle(t)
			testutil.WaitFor(t, "the request to be aborted", 5*time.Second, func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return len(b.aborted) == 1 && b.aborted[0] == b.reqs[0].ID
			})
		})
	}
}
