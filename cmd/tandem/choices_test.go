package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// storiesChatTemplate is the plain story template of the embedded default
// model; the shared stories260K test model has no template of its own.
func storiesChatTemplate(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "internal", "defaultmodel", "stories260K", "chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestChatTemplateFlag(t *testing.T) {
	src := storiesChatTemplate(t)
	file := filepath.Join(t.TempDir(), "story.jinja")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	const inline = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
	for _, c := range []struct {
		name, value, want string
	}{
		{"a file is read", file, src},
		{"a value that is no file is the template itself", inline, inline},
		{"an inline template on several lines", "{{ bos_token }}\n{{ messages[0]['content'] }}", "{{ bos_token }}\n{{ messages[0]['content'] }}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseServeFlags([]string{"--model", "m", "--chat-template", c.value})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ChatTemplate != c.want {
				t.Errorf("template %q, want %q", cfg.ChatTemplate, c.want)
			}
		})
	}
	t.Run("no flag keeps the model's template", func(t *testing.T) {
		cfg, err := parseServeFlags([]string{"--model", "m"})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ChatTemplate != "" || cfg.TrustRequestChatTemplate {
			t.Errorf("template %q, trust %v", cfg.ChatTemplate, cfg.TrustRequestChatTemplate)
		}
	})
	broken := filepath.Join(t.TempDir(), "broken.jinja")
	if err := os.WriteFile(broken, []byte("{% for m in messages %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, value, want string
	}{
		{"a missing file is an error, not a template", "/no/such/template.jinja", `--chat-template: "/no/such/template.jinja" looks like a file path`},
		{"a directory is an error", t.TempDir(), "looks like a file path"},
		{"an inline template that does not compile", "{% for m in messages %}", "--chat-template: compile chat template"},
		{"a file that does not compile names the file", broken, "--chat-template: " + broken + ": compile chat template"},
		{"an empty file", filepath.Join(t.TempDir(), "empty"), "empty"},
	} {
		t.Run("rejects "+c.name, func(t *testing.T) {
			if c.name == "an empty file" {
				if err := os.WriteFile(c.value, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := parseServeFlags([]string{"--model", "m", "--chat-template", c.value})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestServeChatTemplateFlagServesChat starts a real engine on the shared
// stories260K model, which has no chat template, with --chat-template.
func TestServeChatTemplateFlagServesChat(t *testing.T) {
	file := filepath.Join(t.TempDir(), "story.jinja")
	if err := os.WriteFile(file, []byte(storiesChatTemplate(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := startEngine(t, "--kv-port", "0")
	templated := startEngine(t, "--kv-port", "0", "--chat-template", file)
	body := `{"model":"hf","messages":[{"role":"system","content":"Tell stories."},{"role":"user","content":"Tom had a red ball."},{"role":"assistant","content":"He threw it to his dog."},{"role":"user","content":"The dog ran after it."}],"max_tokens":16,"temperature":0}`
	if status, raw := postJSON(t, plain+"/v1/chat/completions", body, nil); status != http.StatusBadRequest || !strings.Contains(raw, "--chat-template") {
		t.Errorf("chat without a template: %d %s", status, raw)
	}
	status, raw := postJSON(t, templated+"/v1/chat/completions", body, nil)
	if status != http.StatusOK {
		t.Fatalf("chat with --chat-template: %d %s", status, raw)
	}
	var r openai.ChatCompletionResponse
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatal(err)
	}
	_, _, want := completion(t, templated, `{"model":"hf","prompt":"Tom had a red ball.\nHe threw it to his dog.\nThe dog ran after it.\n","max_tokens":16,"temperature":0}`, nil)
	if len(r.Choices) != 1 || r.Choices[0].Message.Content != want {
		t.Errorf("chat answer %+v, want the completion of the rendered conversation %q", r.Choices, want)
	}
	if status, raw := postJSON(t, templated+"/v1/chat/completions", strings.TrimSuffix(body, "}")+`,"chat_template":"{{ 'x' }}"}`, nil); status != http.StatusBadRequest {
		t.Errorf("a request's chat_template without --trust-request-chat-template: %d %s", status, raw)
	}
}

// TestNChoicesThroughPrefillAndDecode runs the two legs of a P/D request by
// hand with n = 3: the prefill leg answers one choice and the params of the
// prompt's KV; the decode leg pulls it for its first choice, and the other
// two find it in the decode's prefix cache. The choices equal a colocated
// engine's n = 1 answers for seeds s, s+1, s+2.
func TestNChoicesThroughPrefillAndDecode(t *testing.T) {
	pre := startEngine(t, "--role", "prefill", "--kv-port", "0")
	dec := startEngine(t, "--role", "decode")
	colo := startEngine(t, "--kv-port", "0")
	const seed = 77
	body := func(extra string) string {
		return fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":16,"temperature":1,"seed":%d%s}`, pdPrompt, seed, extra)
	}

	status, raw := postJSON(t, pre+"/v1/completions", body(`,"n":3,"kv_transfer_params":{"do_remote_decode":true}`), nil)
	if status != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", status, raw)
	}
	var leg1 struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   openai.Usage      `json:"usage"`
		KV      json.RawMessage   `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(raw), &leg1); err != nil || len(leg1.KV) == 0 {
		t.Fatalf("prefill answer without kv_transfer_params: %s", raw)
	}
	if len(leg1.Choices) != 1 {
		t.Errorf("the prefill leg answered %d choices; with do_remote_decode it runs one", len(leg1.Choices))
	}

	hitsBefore := testutil.Metric(t, dec, "vllm:prefix_cache_hits", "")
	status, raw = postJSON(t, dec+"/v1/completions", body(`,"n":3,"kv_transfer_params":`+string(leg1.KV)), nil)
	if status != http.StatusOK {
		t.Fatalf("decode leg: %d %s", status, raw)
	}
	var r openai.CompletionResponse
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 3 {
		_, _, text := completion(t, colo, fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":16,"temperature":1,"seed":%d}`, pdPrompt, seed+i), nil)
		want = append(want, text)
	}
	var got []string
	for i, c := range r.Choices {
		if c.Index != i {
			t.Errorf("choice %d has index %d", i, c.Index)
		}
		got = append(got, c.Text)
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("decode leg choices\n got %q\nwant %q (colocated, seeds %d..%d)", got, want, seed, seed+2)
	}
	// The first choice's cached tokens are the pulled ones (all but the
	// prompt's last token); the other two hit the blocks it pulled.
	if r.Usage.PromptTokensDetails.CachedTokens != r.Usage.PromptTokens-1 {
		t.Errorf("usage %+v: want the pulled prompt counted as cached", *r.Usage)
	}
	full := (r.Usage.PromptTokens - 1) / 16 * 16
	// The engine publishes its counters after the step that answered: they
	// may lag the response (on a loaded machine, a lot; hence a deadline,
	// not a count of polls).
	var hits float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if hits = testutil.Metric(t, dec, "vllm:prefix_cache_hits", "") - hitsBefore; hits >= float64(2*full) || time.Now().After(deadline) {
			break
		}
	}
	if full == 0 || hits < float64(2*full) {
		t.Errorf("decode prefix cache hits %v, want the two extra choices to hit %d tokens each", hits, full)
	}
}
