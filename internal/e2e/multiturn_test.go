package e2e

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestMultiTurnThroughTheProxy runs conversations through real processes:
// a proxy in conversation mode in front of a prefill and a decode engine
// with --kv-bidirectional. Turn 2's prefill must pull turn 1's KV from the
// decode (the prefill's metrics say how many tokens), and every turn must
// answer exactly what a colocated engine answers for the same prompt — for
// completions whose prompt carries the history as text, for chat, streamed
// or not.
func TestMultiTurnThroughTheProxy(t *testing.T) {
	model := testmodels.Stories260K(t)
	_, self, _, _ := runtime.Caller(0)
	template := filepath.Join(filepath.Dir(self), "..", "defaultmodel", "stories260K", "chat_template.jinja")
	common := []string{"--chat-template", template}
	bidir := append([]string{"--kv-bidirectional", "--kv-recompute-threshold", "16"}, common...)
	ref := startEngine(t, engineSpec{name: "colocated", model: model, args: common, env: withSecret})
	p := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill", args: bidir, env: withSecret})
	d := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", args: bidir, env: withSecret})
	proxy := startProxy(t, "proxy", []*engine{p}, []*engine{d}, "--conversations")

	pulled := func() float64 {
		t.Helper()
		v, _ := scrape(t, p.url).get("tandem:kv_history_tokens_pulled_total")
		return v
	}
	check := func(t *testing.T, path string, body map[string]any) generation {
		t.Helper()
		want, _ := generate(t, ref.url, path, body)
		got, r := generate(t, proxy, path, body)
		if r.pd() != "remote" {
			t.Errorf("x-tandem-pd %q, want remote", r.pd())
		}
		if got.Text != want.Text {
			t.Errorf("answer through the proxy differs from the colocated engine's:\n got %q\nwant %q", got.Text, want.Text)
		}
		return got
	}
	body := func(prompt string, n int, stream bool, conv string) map[string]any {
		b := map[string]any{"model": servedName, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream, "conversation_id": conv}
		if stream {
			b["stream_options"] = map[string]any{"include_usage": true}
		}
		return b
	}
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "json", true: "stream"}[stream]
		t.Run("completions, the history as a text prefix, "+name, func(t *testing.T) {
			conv := "completions-" + name
			// Each conversation its own opening, so no turn hits another's
			// blocks in the prefill's own prefix cache.
			prompt1 := map[bool]string{false: "Once upon a time", true: "One day, a little dog"}[stream]
			g1 := check(t, "/v1/completions", body(prompt1, 60, stream, conv))
			before := pulled()
			prompt2 := prompt1 + g1.Text + " The next day"
			check(t, "/v1/completions", body(prompt2, 30, stream, conv))
			got := pulled() - before
			t.Logf("turn 2 pulled %v history tokens", got)
			if got < 32 {
				t.Errorf("turn 2's prefill pulled %v history tokens from the decode, want most of turn 1's ~64", got)
			}
		})
	}
	t.Run("chat", func(t *testing.T) {
		msgs := []map[string]any{{"role": "user", "content": "Tell me a story about a cat."}}
		g1 := check(t, "/v1/chat/completions", map[string]any{"model": servedName, "messages": msgs, "max_tokens": 60,
			"temperature": 0, "conversation_id": "chat"})
		before := pulled()
		msgs = append(msgs, map[string]any{"role": "assistant", "content": g1.Text},
			map[string]any{"role": "user", "content": "Then the cat went home."})
		check(t, "/v1/chat/completions", map[string]any{"model": servedName, "messages": msgs, "max_tokens": 30,
			"temperature": 0, "conversation_id": "chat"})
		if got := pulled() - before; got < 16 {
			t.Errorf("turn 2's prefill pulled %v history tokens from the decode", got)
		}
	})
	// Held conversations are released (or given up on shutdown); the
	// prefill holds nothing once the decode legs read their KV.
	waitPoolsIdle(t, p)
}
