package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
)

// simConfig is a small simulated engine of the embedded default model, as
// `tandem serve --simulate` runs it with its flags' defaults, on free
// ports; knobs is its time model.
func simConfig(t *testing.T, knobs sim.Knobs) server.Config {
	t.Helper()
	return servertest.SimConfig(t, knobs)
}

// idPrompt is n token ids of the stories260K vocabulary.
func idPrompt(n int) string {
	p := []int{1}
	for i := 1; i < n; i++ {
		p = append(p, 10+i%490)
	}
	b, _ := json.Marshal(p)
	return string(b)
}

// post posts body to url and returns the status and the body.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// status is the status of GET url, or -1 when nothing answered.
func status(url string) int {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return -1
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestRunServesTheAPIAndItsSideChannel(t *testing.T) {
	s := servertest.Start(t, simConfig(t, sim.Knobs{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}))
	url := "http://" + s.Addr()
	if got := status(url + "/health"); got != http.StatusOK {
		t.Errorf("/health %d", got)
	}
	if code, body := post(t, url+"/v1/completions", fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":4,"temperature":0}`, idPrompt(20))); code != http.StatusOK {
		t.Errorf("completion: %d %s", code, body)
	}
	if s.KVAddr() == "" || strings.HasSuffix(s.KVAddr(), ":0") {
		t.Errorf("KVAddr %q: an engine of role both serves KV on a bound port", s.KVAddr())
	}
	if c := s.Config(); c.EngineID == "" {
		t.Errorf("no engine id filled in: %+v", c)
	}
}

func TestNewChecksTheConfig(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*server.Config)
		want   string
	}{
		{"no model", func(c *server.Config) { c.Model = "" }, "--model is required"},
		{"both pool sizes", func(c *server.Config) { c.KVCacheMemory = 1 << 30 }, "not both"},
		{"no shutdown timeout", func(c *server.Config) { c.ShutdownTimeout = 0 }, "--shutdown-timeout must be positive"},
		{"an unknown role", func(c *server.Config) { c.Role = "router" }, "use prefill, decode or both"},
		{"an unknown transport", func(c *server.Config) { c.KVTransport = "rdma" }, "use auto, tcp or shm"},
		{"a negative prefill interval", func(c *server.Config) { c.PrefillScheduleInterval = -1 }, "--prefill-schedule-interval must be at least 1"},
	} {
		t.Run("rejects "+c.name, func(t *testing.T) {
			cfg := server.Config{Model: "m", Host: "127.0.0.1", BlockSize: 16, KVCacheDType: "auto", NumBlocks: 8, MaxNumSeqs: 1,
				MaxNumBatchedTokens: 1, Threads: 1, MaxRequestBody: 1, ShutdownTimeout: time.Second, Role: kvconnector.RoleBoth,
				KVLease: time.Second, KVTransport: kvxfer.TransportAuto, KVLoadFailurePolicy: sched.LoadFailureFail}
			if _, err := server.New(cfg); err != nil {
				t.Fatalf("the base config: %v", err)
			}
			c.change(&cfg)
			if _, err := server.New(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestSimulateServesFromAProfileFile starts an engine from a profile file
// (as `tandem profile` writes one) and checks that a request takes the time
// that profile gives: the engine sleeps for its step times, never less.
func TestSimulateServesFromAProfileFile(t *testing.T) {
	prof := sim.DefaultProfile()
	b, err := prof.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := simConfig(t, sim.Knobs{})
	cfg.Simulate = &server.Simulation{Profile: file, Speed: 1, MeanOutputLen: 128, Faults: sim.Faults{StallFor: time.Second}}
	url := "http://" + servertest.Start(t, cfg).Addr()
	const n = 256
	begin := time.Now()
	code, body := post(t, url+"/v1/completions", fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":1,"temperature":0}`, idPrompt(n)))
	took := time.Since(begin)
	if code != http.StatusOK {
		t.Fatalf("answer %d %s", code, body)
	}
	want := time.Duration(prof.PrefillSeconds(n) * float64(time.Second))
	if took < want*9/10 {
		t.Errorf("a %d-token prefill took %v, the profile says %v: the engine did not sleep for its step time", n, took, want)
	}
	t.Logf("%d-token prefill: %v (profile %v)", n, took, want)
}

// run starts the engine of cfg and returns it, its context's cancel (the
// signal) and the channel that gets Run's result.
func run(t *testing.T, cfg server.Config) (*server.Server, context.CancelFunc, <-chan error) {
	t.Helper()
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(cancel)
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("engine did not start: %v", err)
	case <-time.After(servertest.StartTimeout):
		t.Fatal("engine did not start in time")
	}
	return s, cancel, done
}

// stream starts a streamed completion of maxTokens tokens, waits for its
// first event, and returns the rest of the stream.
func stream(t *testing.T, url string, maxTokens int) *bufio.Scanner {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":%d,"temperature":0,"stream":true}`, idPrompt(8), maxTokens)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			return sc
		}
	}
	t.Fatalf("the stream ended before its first event: %v", sc.Err())
	return nil
}

// finish reads the rest of a stream and returns its last finish_reason and
// whether it ended with [DONE].
func finish(t *testing.T, sc *bufio.Scanner) (reason string, done bool) {
	t.Helper()
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return reason, true
		}
		var ev struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			}
		}
		if json.Unmarshal([]byte(data), &ev) == nil && len(ev.Choices) == 1 && ev.Choices[0].FinishReason != nil {
			reason = *ev.Choices[0].FinishReason
		}
	}
	return reason, false
}

// TestDrainFinishesRequestsInFlight ends Run's context while a request
// streams: readiness fails at once while liveness stays up, a new request
// gets an OpenAI-shaped 503, the request in flight runs to its end, and Run
// returns nil (`tandem serve` exits 0).
func TestDrainFinishesRequestsInFlight(t *testing.T) {
	cfg := simConfig(t, sim.Knobs{TTFT: 2 * time.Millisecond, ITL: 20 * time.Millisecond})
	cfg.Simulate.MeanOutputLen = 0 // no EOS: the answer runs to max_tokens
	s, cancel, done := run(t, cfg)
	url := "http://" + s.Addr()
	sc := stream(t, url, 40) // about 0.8s of decode steps

	cancel()
	deadline := time.Now().Add(time.Second)
	for status(url+"/health") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatalf("/health answers %d a second into the drain, want 503", status(url+"/health"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := status(url + "/livez"); got != http.StatusOK {
		t.Errorf("/livez answers %d while draining, want 200", got)
	}
	code, body := post(t, url+"/v1/completions", `{"model":"hf","prompt":"Once","max_tokens":2}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"type":"ServiceUnavailableError"`) {
		t.Errorf("a new request while draining: %d %s, want an OpenAI-shaped 503", code, body)
	}
	if reason, ended := finish(t, sc); reason != "length" || !ended {
		t.Errorf("the request in flight ended with finish_reason %q, [DONE] %v; want it to run to max_tokens", reason, ended)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil: nothing was cut short", err)
		}
	case <-time.After(cfg.ShutdownTimeout):
		t.Error("Run did not return within --shutdown-timeout of a drain with nothing left")
	}
}

// TestDrainAbortsWhatOutlivesTheShutdownTimeout drains an engine whose
// request would run far longer than its shutdown timeout: the request is
// cut, and Run returns an error (`tandem serve` exits 1) soon after the
// timeout.
func TestDrainAbortsWhatOutlivesTheShutdownTimeout(t *testing.T) {
	cfg := simConfig(t, sim.Knobs{TTFT: 2 * time.Millisecond, ITL: 100 * time.Millisecond})
	cfg.Simulate.MeanOutputLen = 0
	cfg.ShutdownTimeout = 200 * time.Millisecond
	s, cancel, done := run(t, cfg)
	sc := stream(t, "http://"+s.Addr(), 400) // about 40s

	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Run returned nil although a request was cut short")
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the drain took %v with a 200ms shutdown timeout", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s into a drain with a 200ms shutdown timeout")
	}
	if reason, _ := finish(t, sc); reason == "length" {
		t.Error("the request ran to max_tokens although the drain cut it")
	}
}
