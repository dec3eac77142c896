package openai

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
)

func TestFormatTiming(t *testing.T) {
	tests := []struct {
		name string
		t    engine.Timing
		api  time.Duration
		want string
	}{
		{"a local request has no kv_pull", engine.Timing{Queue: 1500 * time.Microsecond, Prefill: 12 * time.Millisecond}, 310 * time.Microsecond,
			"api;dur=0.310, queue;dur=1.500, prefill;dur=12.000"},
		{"a remote decode's KV load and its wait to run come between", engine.Timing{Queue: 0, KVLoad: 35871 * time.Microsecond, KVReady: 412 * time.Microsecond, Prefill: 2530 * time.Microsecond}, 0,
			"api;dur=0.000, queue;dur=0.000, kv_pull;dur=35.871, kv_ready;dur=0.412, prefill;dur=2.530"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatTiming(&tc.t, tc.api); got != tc.want {
				t.Errorf("formatTiming = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRealEngineAnswersCarryServerTiming: every answer shape of a real
// engine (completion and chat, streamed and whole) has a Server-Timing
// header with the server's own time and the queue and prefill of its first
// token, within the time the client waited.
func TestRealEngineAnswersCarryServerTiming(t *testing.T) {
	s := startStories(t, "stories260K", func(c *Config) {
		c.ChatTemplate = func(msgs []Message, gen bool) (string, error) { return "Once upon a time", nil }
	})
	entry := regexp.MustCompile(`^api;dur=([0-9.]+), queue;dur=([0-9.]+), prefill;dur=([0-9.]+)$`)
	for _, tc := range []struct{ name, path, body string }{
		{"a streamed completion", "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"stream":true}`},
		{"a whole completion", "/v1/completions", `{"model":"stories260K","prompt":[1,403,407],"max_tokens":4}`},
		{"a streamed chat", "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true}`},
		{"a whole chat", "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			resp, body := post(t, s.url+tc.path, tc.body, nil)
			waited := time.Since(start)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			st := resp.Header.Get(HeaderServerTiming)
			m := entry.FindStringSubmatch(st)
			if m == nil {
				t.Fatalf("Server-Timing %q, want queue and prefill entries", st)
			}
			a, _ := strconv.ParseFloat(m[1], 64)
			q, _ := strconv.ParseFloat(m[2], 64)
			p, _ := strconv.ParseFloat(m[3], 64)
			if a <= 0 || p <= 0 || q < 0 || time.Duration((a+q+p)*float64(time.Millisecond)) > waited {
				t.Errorf("Server-Timing %q: want positive api and prefill times, and the three within the %v the client waited", st, waited)
			}
		})
	}
}
