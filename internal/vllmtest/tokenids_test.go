package vllmtest

import (
	"encoding/json"
	"maps"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

var tokenIDName = regexp.MustCompile(`^token_id:[0-9]+$`)

// tokenNames is every token name in a completions or chat answer's
// logprobs (sampled and top entries, the completions' top_logprobs keys),
// and the chat answer's sampled tokens' "bytes" as strings.
type tokenNames struct {
	names []string
	bytes []string
}

// add adds the names in one answer or streamed chunk; a chunk without
// logprobs adds none.
func (out *tokenNames) add(t *testing.T, body []byte) {
	t.Helper()
	var a struct {
		Choices []struct {
			Logprobs *struct {
				Tokens      []string             `json:"tokens"`
				TopLogprobs []map[string]float64 `json:"top_logprobs"`
				Content     []struct {
					Token       string `json:"token"`
					Bytes       []int  `json:"bytes"`
					TopLogprobs []struct {
						Token string `json:"token"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	if len(a.Choices) == 0 || a.Choices[0].Logprobs == nil {
		return
	}
	lp := a.Choices[0].Logprobs
	out.names = append(out.names, lp.Tokens...)
	for _, m := range lp.TopLogprobs {
		for k := range m {
			out.names = append(out.names, k)
		}
	}
	for _, c := range lp.Content {
		out.names = append(out.names, c.Token)
		b := make([]byte, len(c.Bytes))
		for i, v := range c.Bytes {
			b[i] = byte(v)
		}
		out.bytes = append(out.bytes, string(b))
		for _, top := range c.TopLogprobs {
			out.names = append(out.names, top.Token)
		}
	}
}

// names reads a plain answer, or each data chunk of a streamed one.
func names(t *testing.T, body []byte, stream bool) tokenNames {
	t.Helper()
	var out tokenNames
	if !stream {
		out.add(t, body)
		return out
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if ok && data != "[DONE]" {
			out.add(t, []byte(data))
		}
	}
	return out
}

// TestReturnTokensAsTokenIDsLikeVLLM sends the same requests with
// return_tokens_as_token_ids to vllm serve and to tandem serve on one model
// directory: both name every logprobs token, sampled and top, "token_id:N",
// and both give a chat token's bytes as its text's, not its name's.
func TestReturnTokensAsTokenIDsLikeVLLM(t *testing.T) {
	env := Require(t)
	model := smolModel(t)
	bin := buildTandem(t)
	v := Start(t, env, Options{Model: model, BlockSize: 32})
	tp := startTandem(t, bin, 2*time.Minute, "serve", "--model", model, "--served-model-name", "tiny")
	reqs := []struct {
		name, path string
		body       map[string]any
	}{
		{"completion", "/v1/completions", map[string]any{"prompt": "hello world", "logprobs": 2}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hello"}}, "logprobs": true, "top_logprobs": 2}},
	}
	for _, r := range reqs {
		for _, stream := range []bool{false, true} {
			body := map[string]any{"model": "tiny", "max_tokens": 4, "temperature": 0, "return_tokens_as_token_ids": true, "stream": stream}
			maps.Copy(body, r.body)
			for _, server := range []struct{ name, url string }{{"vllm", v.URL}, {"tandem", tp.url}} {
				resp, out := post(t, server.url+r.path, body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s %s (stream %v): %d %s", server.name, r.name, stream, resp.StatusCode, out)
				}
				got := names(t, out, stream)
				if len(got.names) == 0 {
					t.Errorf("%s %s: no token names in %s", server.name, r.name, out)
				}
				for _, n := range got.names {
					if !tokenIDName.MatchString(n) {
						t.Errorf("%s %s: token named %q, want token_id:N (answer %s)", server.name, r.name, n, out)
					}
				}
				for _, b := range got.bytes {
					if tokenIDName.MatchString(b) {
						t.Errorf("%s %s: a sampled token's bytes are its name %q, want its text's", server.name, r.name, b)
					}
				}
				t.Logf("%s %s (stream %v): %s", server.name, r.name, stream, out)
			}
		}
	}
}
