package openai

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// bytesJSON is the JSON "bytes" list of s.
func bytesJSON(s string) string {
	b, _ := json.Marshal(byteList(s))
	return string(b)
}

// TestReturnTokensAsTokenIDs checks vLLM's return_tokens_as_token_ids on
// both endpoints, streaming and not: logprobs and top logprobs name tokens
// "token_id:N"; completions' text offsets advance by those names' lengths;
// chat's sampled-token bytes stay the token's text while top entries' bytes
// are their names', as vLLM writes them. (The byte tokenizer's token for
// byte b is b+3: "h" is 107, "e" 104, the top entry "a" 100.)
func TestReturnTokensAsTokenIDs(t *testing.T) {
	b := newFakeBackend(echoScript("hello"))
	_, ts := newTestServer(t, b, nil)
	hdr := map[string]string{"X-Request-Id": "q"}
	usage := `"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}`

	t.Run("completion", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"ab","max_tokens":2,"logprobs":1,"return_tokens_as_token_ids":true}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		want := `{"id":"cmpl-q","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"he","logprobs":{"tokens":["token_id:107","token_id:104"],"token_logprobs":[-0.5,-0.5],"top_logprobs":[{"token_id:100":-1,"token_id:107":-0.5},{"token_id:100":-1,"token_id:104":-0.5}],"text_offset":[0,12]},"finish_reason":"length","stop_reason":null}],` + usage + `}`
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
	})
	t.Run("completion stream", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"ab","max_tokens":2,"logprobs":0,"stream":true,"return_tokens_as_token_ids":true}`, hdr)
		const head = `{"id":"cmpl-q","object":"text_completion","created":1700000000,"model":"m","choices":`
		want := []string{
			head + `[{"index":0,"text":"h","logprobs":{"tokens":["token_id:107"],"token_logprobs":[-0.5],"top_logprobs":[{"token_id:107":-0.5}],"text_offset":[0]},"finish_reason":null,"stop_reason":null}]}`,
			head + `[{"index":0,"text":"e","logprobs":{"tokens":["token_id:104"],"token_logprobs":[-0.5],"top_logprobs":[{"token_id:104":-0.5}],"text_offset":[12]},"finish_reason":null,"stop_reason":null}]}`,
			head + `[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
			`[DONE]`,
		}
		if diff := cmp.Diff(want, sseEvents(t, body)); diff != "" {
			t.Errorf("stream (-want +got):\n%s", diff)
		}
	})
	// chatLogprob is the chat logprob of the token for byte text with top
	// entry top.
	chatLogprob := func(text byte, top string) string {
		id := strconv.Itoa(int(text) + 3)
		return `{"token":"token_id:` + id + `","logprob":-0.5,"bytes":` + bytesJSON(string(text)) +
			`,"top_logprobs":[{"token":"token_id:` + top + `","logprob":-1,"bytes":` + bytesJSON("token_id:"+top) + `}]}`
	}
	t.Run("chat", func(t *testing.T) {
		resp, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":2,"logprobs":true,"top_logprobs":1,"return_tokens_as_token_ids":true}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		want := `{"id":"chatcmpl-q","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"he"},"logprobs":{"content":[` +
			chatLogprob('h', "100") + `,` + chatLogprob('e', "100") +
			`]},"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":18,"completion_tokens":2,"total_tokens":20,"prompt_tokens_details":{"cached_tokens":1}}}`
		if string(body) != want {
			t.Errorf("body\n got %s\nwant %s", body, want)
		}
	})
	t.Run("chat stream", func(t *testing.T) {
		_, body := post(t, ts.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":2,"logprobs":true,"top_logprobs":1,"stream":true,"return_tokens_as_token_ids":true}`, hdr)
		const head = `{"id":"chatcmpl-q","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":`
		want := []string{
			head + `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			head + `[{"index":0,"delta":{"content":"h"},"logprobs":{"content":[` + chatLogprob('h', "100") + `]},"finish_reason":null}]}`,
			head + `[{"index":0,"delta":{"content":"e"},"logprobs":{"content":[` + chatLogprob('e', "100") + `]},"finish_reason":null}]}`,
			head + `[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`,
			`[DONE]`,
		}
		if diff := cmp.Diff(want, sseEvents(t, body)); diff != "" {
			t.Errorf("stream (-want +got):\n%s", diff)
		}
	})
	for _, v := range []string{"false", "null"} {
		t.Run("return_tokens_as_token_ids "+v+" names tokens by text", func(t *testing.T) {
			_, body := post(t, ts.URL+"/v1/completions", `{"model":"m","prompt":"ab","max_tokens":1,"logprobs":0,"return_tokens_as_token_ids":`+v+`}`, hdr)
			want := `{"id":"cmpl-q","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"h","logprobs":{"tokens":["h"],"token_logprobs":[-0.5],"top_logprobs":[{"h":-0.5}],"text_offset":[0]},"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":1}}}`
			if string(body) != want {
				t.Errorf("body\n got %s\nwant %s", body, want)
			}
		})
	}
}
