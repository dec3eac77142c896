package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// generation is what the equivalence tests compare: the choices exactly as
// the server wrote them (one entry for a plain response, one per event for
// a stream), so that any difference in text, token boundaries, logprobs
// (as printed floats: equal only if bit-identical) or finish reason shows,
// plus the usage counts. Ids and timestamps are left out.
type generation struct {
	Choices          []string
	PromptTokens     int
	CompletionTokens int

	text   string // the assembled output, for messages
	finish string // the last finish_reason
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
	if g.CompletionTokens == 0 || g.PromptTokens == 0 || g.finish == "" {
		t.Fatalf("POST %s%s: empty generation (prompt %d, completion %d tokens, finish %q): %s",
			url, path, g.PromptTokens, g.CompletionTokens, g.finish, tail(string(r.body), 2000))
	}
	return g, r
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type wireChoice struct {
	Text    string `json:"text"`
	Message *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

type wireBody struct {
	Choices json.RawMessage `json:"choices"`
	Usage   *wireUsage      `json:"usage"`
}

func (g *generation) add(b wireBody) error {
	if len(b.Choices) == 0 {
		return fmt.Errorf("no choices")
	}
	var cs []wireChoice
	if err := json.Unmarshal(b.Choices, &cs); err != nil {
		return fmt.Errorf("choices: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b.Choices); err != nil {
		return err
	}
	g.Choices = append(g.Choices, buf.String())
	for _, c := range cs {
		g.text += c.Text
		if c.Message != nil {
			g.text += c.Message.Content
		}
		if c.Delta != nil && c.Delta.Content != nil {
			g.text += *c.Delta.Content
		}
		if c.FinishReason != nil {
			g.finish = *c.FinishReason
		}
	}
	if b.Usage != nil {
		g.PromptTokens, g.CompletionTokens = b.Usage.PromptTokens, b.Usage.CompletionTokens
	}
	return nil
}

func parseResponse(body []byte) (generation, error) {
	var b wireBody
	if err := json.Unmarshal(body, &b); err != nil {
		return generation{}, fmt.Errorf("not a JSON response: %w", err)
	}
	if b.Usage == nil {
		return generation{}, fmt.Errorf("no usage in the response")
	}
	var g generation
	return g, g.add(b)
}

// parseStream reads an SSE body that must end with "data: [DONE]". Chunks
// with no choices (the usage chunk) only contribute usage.
func parseStream(body []byte) (generation, error) {
	var g generation
	done := false
	for _, line := range strings.Split(string(body), "\n") {
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
		var b wireBody
		if err := json.Unmarshal([]byte(data), &b); err != nil {
			return g, fmt.Errorf("event %q: %w", data, err)
		}
		if string(b.Choices) == "[]" || len(b.Choices) == 0 {
			if b.Usage != nil {
				g.PromptTokens, g.CompletionTokens = b.Usage.PromptTokens, b.Usage.CompletionTokens
			}
			continue
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
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(generation{})); diff != "" {
		t.Errorf("proxy's answer differs from the colocated engine's (-colocated +proxy):\n%s\ncolocated text %q\nproxy text     %q",
			diff, want.text, got.text)
	}
}
