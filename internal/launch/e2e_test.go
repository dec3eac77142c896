package launch

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestTandemUpEndToEnd builds the real binary and runs `tandem up` on the
// stories260K model as users do, with an API key from the environment: a
// completion without the key is refused, one with it takes the P/D path
// (so the engines share the KV secret up generated: the decode accepted
// the prefill's signed params), and SIGINT must stop every engine, whose
// exits (drained, status 0) are not taken for crashes.
func TestTandemUpEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the tandem binary; skipped in -short mode")
	}
	model := testmodels.Stories260K(t)
	exe := filepath.Join(t.TempDir(), "tandem")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, "github.com/tandem-serve/tandem/cmd/tandem")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help, _ := exec.CommandContext(ctx, exe, "serve", "-h").CombinedOutput()
	if !strings.Contains(string(help), "-role") {
		t.Fatal("`tandem serve` has no --role flag: tandem up cannot start prefill and decode engines")
	}

	var stdout, stderr syncBuffer
	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	// --pd-decider always: the completion below is checked through the P/D
	// path, which the default decider skips for a prompt this short.
	cmd := exec.CommandContext(ctx, exe, "up", "--model", model, "--port", strconv.Itoa(ports[0]), "--served-model-name", "stories", "--pd-decider", "always")
	cmd.Env = append(os.Environ(), "TANDEM_API_KEY=up-test-key", "TANDEM_KV_SECRET=")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	defer func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("tandem up stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		}
	}()

	url := waitEndpoint(t, &stdout, done)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"stories","prompt":"Hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a completion without the API key got %s, want 401", resp.Status)
	}
	pd, body := completion(t, url, "stories", "up-test-key")
	if pd != "remote" {
		t.Errorf("x-tandem-pd %q, want remote (body %s)", pd, body)
	}
	if n := strings.Count(stderr.String(), "kv_secret=true"); n != 2 {
		t.Errorf("%d engines started with a KV secret, want 2", n)
	}
	pids := childPIDs(stderr.String())
	if len(pids) != 2 {
		t.Fatalf("engine pids %v, want prefill-0 and decode-0", pids)
	}

	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("tandem up did not exit within 30s of SIGINT")
	}
	if waitErr != nil {
		t.Errorf("tandem up exited with %v after SIGINT, want 0", waitErr)
	}
	if strings.Contains(stderr.String(), `msg="engine exited`) {
		t.Error("the engines' exits on the shutdown's SIGTERM were taken for crashes")
	}
	checkGone(t, pids)
}
