package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/launch"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestUpRefusesAnEmptyDecodePool: --decode 0, or a negative count, is
// refused before anything starts, naming the flags.
func TestUpRefusesAnEmptyDecodePool(t *testing.T) {
	for _, args := range [][]string{
		{"--decode", "0", "--prefill", "2"},
		{"--prefill", "0", "--decode", "0"},
		{"--prefill", "-1"},
	} {
		err := up(context.Background(), args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "tandem up needs at least one decode engine") || !strings.Contains(err.Error(), "--decode") {
			t.Errorf("tandem up %s: %v, want the refusal naming --prefill and --decode", strings.Join(args, " "), err)
		}
	}
	err := up(context.Background(), []string{"--prefill", "0", "--pd-decider", "always"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--prefill 0 with --pd-decider always") {
		t.Errorf("tandem up --prefill 0 --pd-decider always: %v, want it refused naming the decider", err)
	}
}

// TestUpColocated runs tandem up --simulate --prefill 0 --decode 2, with
// and without the planner: two simulated engines (processes) and the proxy
// on loopback, every prompt prefilled on its decode (reason colocated), a
// chat completion answered, and with the planner the plan route reporting
// 0 prefill and 2 decode engines.
func TestUpColocated(t *testing.T) {
	simModelOnce.Do(func() {
		simModelDir, simModelErr = defaultmodel.Install(filepath.Join(os.TempDir(), "tandem-sim-test-model"))
	})
	if simModelErr != nil {
		t.Fatal(simModelErr)
	}
	t.Setenv(actAsTandem, "1")
	for _, planner := range []bool{false, true} {
		name := "without the planner"
		args := []string{"--simulate", "--prefill", "0", "--decode", "2", "--port", "0", "--model", simModelDir, "--served-model-name", "hf"}
		if planner {
			name = "with the planner"
			args = append(args, "--slo-ttft", "1s", "--slo-tpot", "100ms")
		}
		args = append(args, "--", "--sim-ttft", "2ms", "--sim-itl", "1ms", "--sim-prefill-per-token", "10us",
			"--num-blocks", "256", "--max-num-seqs", "8", "--log-level", "error")
		t.Run(name, func(t *testing.T) {
			var stdout, stderr lockedBuffer
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- up(ctx, args, &stdout, &stderr) }()
			stopped := false
			stop := func() {
				if stopped {
					return
				}
				stopped = true
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("tandem up: %v\nstderr:\n%s", err, stderr.String())
					}
				case <-time.After(time.Minute):
					t.Errorf("tandem up did not stop within a minute of its context's end")
				}
			}
			defer stop()

			var url string
			testutil.WaitFor(t, "tandem up's endpoint line", 2*time.Minute, func() bool {
				select {
				case err := <-done:
					stopped = true
					t.Fatalf("tandem up ended before serving: %v\nstderr:\n%s", err, stderr.String())
				default:
				}
				url = endpointOf(stdout.String())
				return url != ""
			})
			if !strings.Contains(stdout.String(), "(2 decode, colocated: each prefills its own prompts") {
				t.Errorf("the endpoint line does not say the split is colocated:\n%s", stdout.String())
			}
			a := ask(t, url, "/v1/chat/completions", `{"model":"hf","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":8,"ignore_eos":true}`)
			if a.status != http.StatusOK || a.pd != "local; reason=colocated" || a.text == "" {
				t.Fatalf("a chat completion: %d, x-tandem-pd %q, text %q %s; want it served on a decode (reason colocated)", a.status, a.pd, a.text, a.body)
			}
			status, plan, err := testutil.GetPlan(t, url+proxy.PlanPath)
			switch {
			case !planner && status != http.StatusNotFound:
				t.Errorf("GET %s without the planner: %d, want 404", proxy.PlanPath, status)
			case planner && (err != nil || !plan.Acting || len(plan.Prefill) != 0 || len(plan.Decode) != 2):
				t.Errorf("GET %s: %+v (%v), want the planner acting on 0 prefill + 2 decode", proxy.PlanPath, plan, err)
			}
			if got := testutil.Metric(t, url, "tandem:proxy_pd_decisions_total", `decision="local",reason="colocated"`); got != 1 {
				t.Errorf("colocated decisions counted %v, want 1", got)
			}
			stop()
		})
	}
}

// endpointOf returns the URL tandem up's endpoint line announces in out,
// "" before it.
func endpointOf(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), launch.EndpointPrefix); ok {
			url, _, _ := strings.Cut(rest, " ")
			return url
		}
	}
	return ""
}

// lockedBuffer is a strings.Builder safe for one writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
