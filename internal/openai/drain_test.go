package openai

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestDrain: once Drain is called, readiness (/health) fails and new
// generation requests get an OpenAI-shaped 503 that a router retries
// elsewhere, while liveness (/livez) stays 200 and the request in flight
// streams on; InFlight counts it until its answer ends.
func TestDrain(t *testing.T) {
	b := newFakeBackend(func(*engine.Request) []engine.Event { return []engine.Event{{Tokens: []int32{10}, Text: "x"}} })
	b.hold = true // the request in flight runs until its client leaves
	s, ts := newTestServer(t, b, nil)
	status := func(method, path string) int {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, nil)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/health", "/livez"} {
		if got := status("GET", path); got != 200 {
			t.Fatalf("GET %s before the drain: %d, want 200", path, got)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a","max_tokens":40,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if n := s.InFlight(); n != 1 {
		t.Fatalf("InFlight %d with one stream open, want 1", n)
	}

	s.Drain()
	cases := []struct {
		method, path string
		want         int
	}{
		{"GET", "/health", 503}, {"HEAD", "/health", 503},
		{"GET", "/livez", 200}, {"HEAD", "/livez", 200},
		{"GET", "/metrics", 404}, // no Metrics handler in this test: still routed, not refused
	}
	for _, c := range cases {
		if got := status(c.method, c.path); got != c.want {
			t.Errorf("%s %s while draining: %d, want %d", c.method, c.path, got, c.want)
		}
	}
	for _, r := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","prompt":"a","max_tokens":4}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":4}`},
	} {
		resp, err := http.Post(ts.URL+r.path, "application/json", strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, resp, 503, TypeUnavailable, "", "shutting down")
		resp.Body.Close()
	}
	if n := len(b.requests()); n != 1 {
		t.Errorf("the backend saw %d requests, want only the one in flight before the drain", n)
	}
	if n := s.InFlight(); n != 1 {
		t.Errorf("InFlight %d while the stream is still open, want 1", n)
	}
	cancel()
	b.waitIdle(t)
	testutil.WaitFor(t, "InFlight to reach 0", 5*time.Second, func() bool { return s.InFlight() == 0 })
}
