package launch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// The prompt of the supervisor test: 50 tokens, so that a prefill holds
// whole blocks of its KV for a decode.
const superviseePrompt = "Once upon a time there was a little girl named Lily. She loved to play outside in the park. One day she saw a big red ball and she wanted to play with it."

// TestTandemUpRestartsAKilledEngine runs the real binary with real engines:
// prefill-0 is killed with SIGKILL while a stream of requests runs through
// the proxy. Every request must end with a complete answer or a clear
// (OpenAI-shaped) error, errors are bounded; a decode given KV params that
// the dead prefill held computes the prompt itself (tandem up's
// --kv-load-failure-policy recompute) instead of failing; prefill-0 comes
// back on its port and new requests take the P/D path again. Then it is
// killed again with its port taken, so that every restart exits at once:
// `tandem up` must give up after --restart-limit restarts and exit 1,
// naming it, with every engine gone.
func TestTandemUpRestartsAKilledEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the tandem binary; skipped in -short mode")
	}
	model := testmodels.Stories260K(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // after startUp's shutdown
	exe := buildTandem(ctx, t)

	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe, "up", "--model", model, "--port", strconv.Itoa(ports[0]), "--served-model-name", "stories",
		"--restart-backoff", "300ms", "--restart-limit", "2", "--restart-window", "1m",
		"--pd-decider", "always") // every request takes the P/D path whose recovery the test checks
	cmd.Env = append(os.Environ(), "TANDEM_API_KEY=", "TANDEM_KV_SECRET=")
	up := startUp(t, cmd)
	url := waitEndpoint(t, &up.stdout, up.done)
	urls, pids := engineURLs(up.stderr.String()), childPIDs(up.stderr.String())
	prefill, decode := urls["prefill-0"], urls["decode-0"]

	// KV that prefill-0 holds for a decode, to be pulled after it died.
	held := post(t, prefill+"/v1/completions", `{"model":"stories","prompt":"`+superviseePrompt+`","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	if held.status != http.StatusOK || held.kv == nil {
		t.Fatalf("prefill leg: %d %s, want 200 with kv_transfer_params", held.status, held.body)
	}

	load := startLoad(url)
	waitFor(t, 30*time.Second, up.done, "5 answers before the kill", func() bool { return load.count().ok >= 5 })
	if err := syscall.Kill(pids["prefill-0"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	t.Run("a decode whose prefill died computes the prompt itself", func(t *testing.T) {
		a := post(t, decode+"/v1/completions", `{"model":"stories","prompt":"`+superviseePrompt+`","max_tokens":8,"temperature":0,"kv_transfer_params":`+string(held.kv)+`}`)
		if a.status != http.StatusOK || !a.complete {
			t.Errorf("decode leg with the dead prefill's params: %d %s, want a complete answer", a.status, a.body)
		}
		if m := get(t, decode+"/metrics"); !strings.Contains(m, "tandem:kv_transfer_failures_total{") {
			t.Errorf("the decode counted no failed pull:\n%s", m)
		}
	})

	t.Run("prefill-0 comes back on its port and P/D resumes", func(t *testing.T) {
		waitFor(t, 30*time.Second, up.done, "prefill-0 healthy again", func() bool {
			return strings.Contains(up.stderr.String(), `msg="engine healthy again" engine=prefill-0`) && healthOK(prefill)
		})
		back := time.Since(killed)
		want := `msg="engine exited; restarting" engine=prefill-0 role=prefill pid=` + strconv.Itoa(pids["prefill-0"]) + ` exit="was killed by signal killed" restart=1`
		if !strings.Contains(up.stderr.String(), want) {
			t.Errorf("no log line %s", want)
		}
		waitFor(t, 10*time.Second, up.done, "a request through P/D after the restart", func() bool {
			a := post(t, url+"/v1/completions", `{"model":"stories","prompt":"`+superviseePrompt+`","max_tokens":4}`)
			return a.pd == "remote" && a.complete
		})
		t.Logf("prefill-0 healthy %v after SIGKILL; P/D again %v after it", back.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	})

	n := load.stop()
	t.Logf("requests during the kill: %+v", n)
	if n.unclear > 0 || n.clearErr > 2 || n.ok < 10 {
		t.Errorf("requests %+v: want no unclear failure, at most 2 clear errors and at least 10 answers", n)
	}

	t.Run("an engine that keeps exiting stops tandem up with exit status 1, named", func(t *testing.T) {
		pid := childPIDs(up.stderr.String())["prefill-0"]
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		waitFor(t, 10*time.Second, up.done, "prefill-0's port free", func() bool {
			var err error
			ln, err = net.Listen("tcp", strings.TrimPrefix(prefill, "http://"))
			return err == nil
		})
		defer ln.Close()
		select {
		case <-up.done:
		case <-time.After(60 * time.Second):
			t.Fatal("tandem up still runs 60s after prefill-0 began to exit at once")
		}
		var ee *exec.ExitError
		if !errors.As(up.err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("tandem up ended with %v, want exit status 1", up.err)
		}
		if want := "tandem up: prefill-0 keeps exiting: it exited with status 1 after 2 restarts within 1m0s"; !strings.Contains(up.stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	})
}

// answer is what post got.
type answer struct {
	status   int
	pd       string
	body     string
	kv       json.RawMessage // kv_transfer_params, if any
	complete bool            // a choice with a finish_reason
	clearErr bool            // an OpenAI-shaped error with a message
}

// post posts body to url and reads the answer; a transport error fails t.
func post(t *testing.T, url, body string) answer {
	t.Helper()
	a, err := tryPost(url, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func tryPost(url, body string) (answer, error) {
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, pd: resp.Header.Get("X-Tandem-Pd"), body: string(b)}
	var v struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		KV    json.RawMessage `json:"kv_transfer_params"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil {
		a.kv = v.KV
		a.complete = resp.StatusCode == http.StatusOK && len(v.Choices) == 1 && v.Choices[0].FinishReason != ""
		a.clearErr = resp.StatusCode != http.StatusOK && v.Error != nil && v.Error.Message != ""
	}
	return a, nil
}

// load is a stream of completions through the proxy, two at a time.
type load struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	n     loadCount
}

// loadCount counts a load's requests by how they ended.
type loadCount struct {
	ok, clearErr, unclear int
	pd                    map[string]int // x-tandem-pd of the answers
}

func startLoad(url string) *load {
	l := &load{stopc: make(chan struct{}), n: loadCount{pd: map[string]int{}}}
	for range 2 {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stopc:
					return
				default:
				}
				a, err := tryPost(url+"/v1/completions", `{"model":"stories","prompt":"`+superviseePrompt+`","max_tokens":16}`)
				l.mu.Lock()
				switch {
				case err == nil && a.complete:
					l.n.ok++
					l.n.pd[a.pd]++
				case err == nil && a.clearErr:
					l.n.clearErr++
				default:
					l.n.unclear++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *load) count() loadCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *load) stop() loadCount {
	close(l.stopc)
	l.wg.Wait()
	return l.count()
}
