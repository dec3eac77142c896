package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// generation is what the equivalence tests compare: the assembled text,
// one logprobs entry per generated token (numbers kept as the server
// printed them, so equal only if bit-identical), the finish and stop
// reasons, and the usage counts. Streams are compared assembled: how tokens
// are grouped into events depends on timing (a slow reader gets several per
// event), not on the model. Ids and timestamps are left out.
type generation struct {
	Text             string
	Logprobs         []any
	FinishReason     string
	StopReason       any
	PromptTokens     int
	CompletionTokens int
}

// generate posts body to url+path and parses the answer, streamed or not.
// It fails t unless the answer is a 200 with a non-empty generation.
func generate(t *testing.T, url, path string, body map[string]any) (generation, reply) {
	t.Helper()
	r := postJSON(t, url+path, body)
	if r.status != 200 {
		t.Fatalf("POST %s%s: status %d (x-tandem-pd %q): %s", url, path, r.status, r.pd(), r.body)
	}
	var g generation
	var err error
	if s, _ := body["stream"].(bool); s {
		g, err = parseStream(r.body)
	} else {
		g, err = parseResponse(r.body)
	}
	if err != nil {
		t.Fatalf("POST %s%s: %v\nbody: %s", url, path, err, tail(string(r.body), 2000))
	}
	if g.CompletionTokens == 0 || g.PromptTokens == 0 || g.FinishReason == "" {
		t.Fatalf("POST %s%s: empty generation (prompt %d, completion %d tokens, finish %q): %s",
			url, path, g.PromptTokens, g.CompletionTokens, g.FinishReason, tail(string(r.body), 2000))
	}
	if n, ok := body["max_tokens"].(int); ok && g.CompletionTokens > n {
		t.Fatalf("POST %s%s: %d completion tokens, more than max_tokens %d", url, path, g.CompletionTokens, n)
	}
	if _, ok := body["logprobs"]; ok && len(g.Logprobs) != g.CompletionTokens {
		t.Fatalf("POST %s%s: %d logprobs entries for %d completion tokens", url, path, len(g.Logprobs), g.CompletionTokens)
	}
	return g, r
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type wireChoice struct {
	Index   int    `json:"index"`
	Text    string `json:"text"`
	Message *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	Logprobs *struct {
		// /v1/completions
		Tokens        []any `json:"tokens"`
		TokenLogprobs []any `json:"token_logprobs"`
		TopLogprobs   []any `json:"top_logprobs"`
		TextOffset    []any `json:"text_offset"`
		// /v1/chat/completions
		Content []any `json:"content"`
	} `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type wireBody struct {
	Choices []wireChoice `json:"choices"`
	Usage   *wireUsage   `json:"usage"`
}

// decodeBody decodes one response or event, keeping numbers as printed.
func decodeBody(b []byte) (wireBody, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var w wireBody
	err := d.Decode(&w)
	return w, err
}

func (g *generation) add(b wireBody) error {
	for _, c := range b.Choices {
		if c.Index != 0 {
			return fmt.Errorf("choice index %d, want only 0 (n=1)", c.Index)
		}
		g.Text += c.Text
		if c.Message != nil {
			g.Text += c.Message.Content
		}
		if c.Delta != nil && c.Delta.Content != nil {
			g.Text += *c.Delta.Content
		}
		if lp := c.Logprobs; lp != nil {
			g.Logprobs = append(g.Logprobs, lp.Content...)
			n := len(lp.Tokens)
			if len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
				return fmt.Errorf("logprobs arrays of different lengths: %d tokens, %d logprobs, %d top, %d offsets",
					n, len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset))
			}
			for i := range n {
				g.Logprobs = append(g.Logprobs, []any{lp.Tokens[i], lp.TokenLogprobs[i], lp.TopLogprobs[i], lp.TextOffset[i]})
			}
		}
		if c.FinishReason != nil {
			g.FinishReason, g.StopReason = *c.FinishReason, c.StopReason
		}
	}
	if b.Usage != nil {
		g.PromptTokens, g.CompletionTokens = b.Usage.PromptTokens, b.Usage.CompletionTokens
	}
	return nil
}

func parseResponse(body []byte) (generation, error) {
	b, err := decodeBody(body)
	if err != nil {
		return generation{}, fmt.Errorf("not a JSON response: %w", err)
	}
	if b.Usage == nil {
		return generation{}, fmt.Errorf("no usage in the response")
	}
	if len(b.Choices) != 1 {
		return generation{}, fmt.Errorf("%d choices, want 1", len(b.Choices))
	}
	var g generation
	return g, g.add(b)
}

// parseStream reads an SSE body that must end with "data: [DONE]".
func parseStream(body []byte) (generation, error) {
	var g generation
	done := false
	for line := range strings.SplitSeq(string(body), "\n") {
		line = strings.TrimRight(line, "\r")
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if done {
			return g, fmt.Errorf("event after [DONE]: %q", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		b, err := decodeBody([]byte(data))
		if err != nil {
			return g, fmt.Errorf("event %q: %w", data, err)
		}
		if err := g.add(b); err != nil {
			return g, fmt.Errorf("event %q: %w", data, err)
		}
	}
	if !done {
		return g, fmt.Errorf("stream ended without data: [DONE]")
	}
	return g, nil
}

// sameGeneration fails t if got (through the proxy) differs from want (the
// colocated engine).
func sameGeneration(t *testing.T, want, got generation) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("proxy's answer differs from the colocated engine's (-colocated +proxy):\n%s\ncolocated text %q\nproxy text     %q",
			diff, want.Text, got.Text)
	}
}
