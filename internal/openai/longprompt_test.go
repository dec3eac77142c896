package openai

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestOverLongPromptIsRefusedWithoutEncodingItAll: a 10 MB prompt to an
// engine with a 512-token context gets the context-length 400, and the
// whole request allocates a small multiple of the body, not the hundreds
// of MB that encoding all of it takes.
func TestOverLongPromptIsRefusedWithoutEncodingItAll(t *testing.T) {
	dir := testmodels.Stories260K(t)
	s := startReal(t, dir, "stories260K", func(c *Config) {
		c.ChatTemplate = func(msgs []Message, gen bool) (string, error) {
			var b strings.Builder
			for _, m := range msgs {
				b.WriteString(m.Role + ": " + m.Content + "\n")
			}
			return b.String(), nil
		}
	})
	words := strings.Fields("once upon a time there was a little girl named lily she liked to play in the park with her dog")
	var b strings.Builder
	for i := 0; b.Len() < 10<<20; i++ {
		b.WriteString(words[i%len(words)])
		b.WriteByte(' ')
	}
	prompt, _ := json.Marshal(b.String())
	for _, tc := range []struct{ name, path, body, param string }{
		{"completions", "/v1/completions", `{"model":"stories260K","max_tokens":1,"prompt":` + string(prompt) + `}`, "prompt"},
		{"chat", "/v1/chat/completions", `{"model":"stories260K","max_tokens":1,"messages":[{"role":"user","content":` + string(prompt) + `}]}`, "messages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, body := post(t, s.url+tc.path, tc.body, nil)
			runtime.ReadMemStats(&after)
			if resp.StatusCode != 400 || !strings.Contains(string(body), "maximum context length is 512 tokens") || !strings.Contains(string(body), `"param":"`+tc.param+`"`) {
				t.Fatalf("status %d: %.300s", resp.StatusCode, body)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 160<<20 {
				t.Errorf("refusing a 10 MB prompt allocated %d MB, want at most 160", got>>20)
			}
			t.Logf("allocated %d MB", (after.TotalAlloc-before.TotalAlloc)>>20)
		})
	}
}
