package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// TestEmptyPrompt checks that an empty prompt string is a prompt of its
// special tokens, as vLLM treats it: stories260K's tokenizer adds BOS, so
// "" is [BOS], the golden greedy prompt. Only a prompt that tokenizes to
// nothing is refused.
func TestEmptyPrompt(t *testing.T) {
	st := loaded.Stories(t)
	g, tok := st.Golden, st.Tokenizer
	if len(g.PromptIDs) != 1 {
		t.Fatalf("golden prompt %v, want [BOS]", g.PromptIDs)
	}
	const n = 8
	want := tok.Decode(g.GreedyIDs[1:1+n], true)
	s := startStories(t, "stories260K")

	for _, tc := range []struct{ name, prompt string }{
		{"an empty string is generated from BOS", `""`},
		{"an empty string in a list of prompts is generated from BOS", `["", ""]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, s.url+"/v1/completions", `{"model":"stories260K","prompt":`+tc.prompt+`,"max_tokens":8,"temperature":0,"ignore_eos":true}`, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var r CompletionResponse
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			prompts := strings.Count(tc.prompt, `""`)
			if len(r.Choices) != prompts {
				t.Fatalf("%d choices for %d prompts", len(r.Choices), prompts)
			}
			for _, c := range r.Choices {
				if c.Text != want {
					t.Errorf("choice %d: text %q, want the golden greedy %q", c.Index, c.Text, want)
				}
			}
			if r.Usage.PromptTokens != prompts || r.Usage.CompletionTokens != n*prompts {
				t.Errorf("usage %+v, want %d prompt (BOS each) and %d completion tokens", *r.Usage, prompts, n*prompts)
			}
		})
	}
	t.Run("a prompt with no tokens at all is still a 400", func(t *testing.T) {
		resp, body := post(t, s.url+"/v1/completions", `{"model":"stories260K","prompt":[[]]}`, nil)
		if resp.StatusCode != 400 || !strings.Contains(string(body), "empty") {
			t.Errorf("status %d: %s; want 400 naming the empty prompt", resp.StatusCode, body)
		}
	})
}
