package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// simArgs are the flags of the simulated engines in these tests: fast
// knobs, small batches. The model directory (for the tokenizer, chat
// template and config) is the embedded default model's, so the tests need
// no test data.
var simArgs = []string{"--served-model-name", "hf", "--simulate", "--sim-ttft", "2ms", "--sim-itl", "1ms", "--sim-prefill-per-token", "10us",
	"--port", "0", "--num-blocks", "256", "--max-num-seqs", "8", "--log-level", "error", "--shutdown-timeout", "5s"}

var (
	simModelOnce sync.Once
	simModelDir  string
	simModelErr  error
)

// startSimEngine runs `tandem serve --simulate` in-process and returns its
// URL and its simulated model; it stops when the test ends.
func startSimEngine(t *testing.T, args ...string) (string, *sim.Model) {
	t.Helper()
	simModelOnce.Do(func() {
		simModelDir, simModelErr = defaultmodel.Install(filepath.Join(os.TempDir(), "tandem-sim-test-model"))
	})
	if simModelErr != nil {
		t.Fatal(simModelErr)
	}
	f, err := parseServeFlags(joinSimulateArg(append(append([]string{"--model", simModelDir}, simArgs...), args...)))
	if err != nil {
		t.Fatal(err)
	}
	var m *sim.Model
	f.Simulate.OnModel = func(sm *sim.Model) { m = sm }
	return "http://" + servertest.Start(t, f.Config).Addr(), m
}

// simAnswer is what a client saw.
type simAnswer struct {
	status       int
	pd           string
	text, finish string
	body         string // the raw body of an error
}

// ask posts body to url+path (stream or not, completions or chat) and
// gathers the answer's text.
func ask(t *testing.T, url, path, body string) simAnswer {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := simAnswer{status: resp.StatusCode, pd: resp.Header.Get(proxy.HeaderPD)}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		a.body = string(raw)
		return a
	}
	type choice struct {
		Text         string `json:"text"`
		Message      *struct{ Content string }
		Delta        *struct{ Content string }
		FinishReason *string `json:"finish_reason"`
	}
	add := func(c choice) {
		a.text += c.Text
		if c.Message != nil {
			a.text += c.Message.Content
		}
		if c.Delta != nil {
			a.text += c.Delta.Content
		}
		if c.FinishReason != nil {
			a.finish = *c.FinishReason
		}
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var r struct{ Choices []choice }
		raw, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(raw, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("answer %s", raw)
		}
		add(r.Choices[0])
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct{ Choices []choice }
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %s: %v", data, err)
		}
		for _, c := range ev.Choices {
			add(c)
		}
	}
	return a
}

func external(t *testing.T, dec string) float64 {
	return testutil.Metric(t, dec, "vllm:prompt_tokens_by_source", `source="external_kv_transfer"`)
}

// idPrompt is n token ids of the stories260K vocabulary, from a stream
// picked by seed; prefix, if given, starts it.
func idPrompt(seed, n int, prefix []int) []int {
	p := append([]int{1}, prefix...)
	for i := len(p); i < n; i++ {
		p = append(p, 10+int(uint64(seed*7919+i*104729)%490))
	}
	return p[:n]
}

// TestSimulatedPDMatchesColocated is the P/D equivalence matrix on
// simulated engines: every request through the proxy (a simulated prefill
// and decode exchanging real KV blocks over the side channel) answers what
// a simulated colocated engine answers, and the decode checked the pattern
// of every block it pulled before using it — over shared memory and over
// TCP, each forced, so both transports put every block in its place.
func TestSimulatedPDMatchesColocated(t *testing.T) {
	solo, _ := startSimEngine(t)
	pre, preModel := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	for _, transport := range []string{"shm", "tcp"} {
		t.Run("over "+transport, func(t *testing.T) {
			dec, decModel := startSimEngine(t, "--role", "decode", "--kv-transport", transport)
			_, pd := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
			waitHealthy(t, pd)
			simulatedMatrix(t, solo, pd, dec, decModel)
		})
	}
	if s := preModel.Stats(); s.BadForwards != 0 || s.Requests == 0 {
		t.Errorf("prefill stats %+v", s)
	}
}

// simulatedMatrix runs the equivalence matrix through pd against solo.
func simulatedMatrix(t *testing.T, solo, pd, dec string, decModel *sim.Model) {

	shared := idPrompt(99, 40, nil)
	type prompt struct {
		name string
		path string
		body string // the request without sampling and streaming fields
	}
	var prompts []prompt
	for _, n := range []int{2, 5, 15, 16, 17, 33, 64, 150, 300} {
		ids, _ := json.Marshal(idPrompt(n, n, nil))
		prompts = append(prompts, prompt{fmt.Sprintf("%d prompt tokens", n), "/v1/completions", fmt.Sprintf(`"prompt":%s`, ids)})
	}
	for _, n := range []int{48, 70} {
		ids, _ := json.Marshal(idPrompt(n+1000, n, shared[1:]))
		prompts = append(prompts, prompt{fmt.Sprintf("%d tokens sharing 40 with other prompts (prefix hits)", n), "/v1/completions", fmt.Sprintf(`"prompt":%s`, ids)})
	}
	prompts = append(prompts,
		prompt{"a text prompt", "/v1/completions", `"prompt":"Once upon a time, there was a little girl named Lily. She loved to play outside."`},
		prompt{"a chat", "/v1/chat/completions", `"messages":[{"role":"user","content":"Tell me a story about a dog and a ball."},{"role":"assistant","content":"Once there was a dog."},{"role":"user","content":"Go on."}]`},
	)
	samplings := []struct{ name, fields string }{
		{"greedy", `"temperature":0`},
		{"seeded at temperature 0.8", `"temperature":0.8,"seed":1234`},
	}
	var pulls int
	for _, p := range prompts {
		for _, s := range samplings {
			for _, stream := range []bool{false, true} {
				name := fmt.Sprintf("%s, %s, stream=%v", p.name, s.name, stream)
				t.Run(name, func(t *testing.T) {
					body := fmt.Sprintf(`{"model":"hf",%s,%s,"max_tokens":24,"stream":%v}`, p.body, s.fields, stream)
					want := ask(t, solo, p.path, body)
					if want.status != http.StatusOK {
						t.Fatalf("colocated: %d %s", want.status, want.body)
					}
					ext, st := external(t, dec), decModel.Stats()
					got := ask(t, pd, p.path, body)
					if got.status != http.StatusOK || got.pd != "remote" {
						t.Fatalf("through the proxy: %d, %s = %q, %s", got.status, proxy.HeaderPD, got.pd, got.body)
					}
					if got.text != want.text || got.finish != want.finish {
						t.Errorf("P/D answered %q (%s), colocated %q (%s)", got.text, got.finish, want.text, want.finish)
					}
					pulled, after := external(t, dec)-ext, decModel.Stats()
					if pulled > 0 {
						pulls++
						if after.LoadsChecked-st.LoadsChecked != 1 || after.CheckedTokens-st.CheckedTokens < int64(pulled) {
							t.Errorf("the decode pulled %v tokens but checked %d loads, %d tokens", pulled, after.LoadsChecked-st.LoadsChecked, after.CheckedTokens-st.CheckedTokens)
						}
					}
					if after.BadLoads != 0 || after.BadForwards != 0 {
						t.Errorf("the decode's KV checks failed: %+v", after)
					}
				})
			}
		}
	}
	if pulls < len(prompts) {
		t.Errorf("only %d requests pulled KV; the matrix should pull for most", pulls)
	}
}

// TestSimulatedCorruptBlock damages a pulled block on arrival at the
// decode (--sim-kv-corrupt-rate 1, the test hook) and checks that the
// pattern check catches it and the load-failure policy decides: fail ends
// the request with an error, recompute answers as a colocated engine would.
func TestSimulatedCorruptBlock(t *testing.T) {
	solo, _ := startSimEngine(t)
	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	ids, _ := json.Marshal(idPrompt(7, 90, nil))
	body := fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":12,"temperature":0}`, ids)
	want := ask(t, solo, "/v1/completions", body)
	for _, policy := range []string{"fail", "recompute"} {
		t.Run("policy "+policy, func(t *testing.T) {
			dec, decModel := startSimEngine(t, "--role", "decode", "--sim-kv-corrupt-rate", "1", "--kv-load-failure-policy", policy)
			_, pd := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
			waitHealthy(t, pd)
			got := ask(t, pd, "/v1/completions", body)
			if s := decModel.Stats(); s.BadLoads != 1 || s.LoadsChecked != 1 {
				t.Errorf("decode stats %+v, want one load checked and found bad", s)
			}
			switch policy {
			case "fail":
				if got.status != http.StatusInternalServerError || !strings.Contains(got.body, "KV pattern check failed") {
					t.Errorf("answer %d %q %s, want a 500 naming the KV pattern check", got.status, got.text, got.body)
				}
			case "recompute":
				if got.status != http.StatusOK || got.text != want.text {
					t.Errorf("answer %d %q %s, want the colocated %q", got.status, got.text, got.body, want.text)
				}
				if local := testutil.Metric(t, dec, "vllm:prompt_tokens_by_source", `source="local_compute"`); local < 2 {
					t.Errorf("the decode computed %v prompt tokens, want the corrupted block's recomputed", local)
				}
			}
		})
	}
}

// TestSimulatedFaults covers the other injected faults end to end.
func TestSimulatedFaults(t *testing.T) {
	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	ids, _ := json.Marshal(idPrompt(8, 40, nil))
	body := fmt.Sprintf(`{"model":"hf","prompt":%s,"max_tokens":4,"temperature":0}`, ids)
	t.Run("--sim-kv-fail-rate 1 fails the request under the fail policy", func(t *testing.T) {
		dec, m := startSimEngine(t, "--role", "decode", "--sim-kv-fail-rate", "1")
		_, pd := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
		waitHealthy(t, pd)
		if got := ask(t, pd, "/v1/completions", body); got.status == http.StatusOK || m.Stats().BadLoads != 1 {
			t.Errorf("answer %+v, stats %+v", got, m.Stats())
		}
	})
	t.Run("--sim-kv-delay holds a load back", func(t *testing.T) {
		dec, _ := startSimEngine(t, "--role", "decode", "--sim-kv-delay", "400ms")
		_, pd := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
		waitHealthy(t, pd)
		start := time.Now()
		if got := ask(t, pd, "/v1/completions", body); got.status != http.StatusOK || got.pd != "remote" {
			t.Fatalf("answer %+v", got)
		}
		if d := time.Since(start); d < 400*time.Millisecond {
			t.Errorf("answered in %v, before the 400ms delay of its load", d)
		}
	})
	t.Run("--sim-error-rate 1 fails requests with a 500 and the engine keeps serving", func(t *testing.T) {
		e, _ := startSimEngine(t, "--sim-error-rate", "1")
		for range 2 {
			if got := ask(t, e, "/v1/completions", body); got.status != http.StatusInternalServerError {
				t.Errorf("answer %+v, want 500", got)
			}
		}
	})
}

func TestSimulateFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string // error substring, "" for success
	}{
		{"--simulate alone picks the built-in profile", []string{"--simulate"}, ""},
		{"--simulate takes a profile as the next argument", []string{"--simulate", "p.json", "--port", "1"}, ""},
		{"knobs without --simulate are an error", []string{"--sim-itl", "1ms"}, "needs --simulate"},
		{"a profile and knobs are two time models", []string{"--simulate", "p.json", "--sim-itl", "1ms"}, "two time models"},
		{"a speed must be positive", []string{"--simulate", "--sim-speed", "0"}, "--sim-speed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseServeFlags(joinSimulateArg(append([]string{"--model", "m"}, c.args...)))
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Sim.Simulate == "" {
					t.Error("not simulated")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
	if got := joinSimulateArg([]string{"--simulate", "a.json", "--", "--simulate", "b.json"}); !slices.Equal(got, []string{"--simulate=a.json", "--", "--simulate", "b.json"}) {
		t.Errorf("joinSimulateArg: %q", got)
	}
}
