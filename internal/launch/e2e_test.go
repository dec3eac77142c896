package launch

import (
	"context"
	"net/http"
	"os"
	"os/exec"
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // after startUp's shutdown
	exe := buildTandem(ctx, t)
	help, _ := exec.CommandContext(ctx, exe, "serve", "-h").CombinedOutput()
	if !strings.Contains(string(help), "-role") {
		t.Fatal("`tandem serve` has no --role flag: tandem up cannot start prefill and decode engines")
	}

	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	// --pd-decider always: the completion below is checked through the P/D
	// path, which the default decider skips for a prompt this short.
	cmd := exec.CommandContext(ctx, exe, "up", "--model", model, "--port", strconv.Itoa(ports[0]), "--served-model-name", "stories", "--pd-decider", "always")
	cmd.Env = append(os.Environ(), "TANDEM_API_KEY=up-test-key", "TANDEM_KV_SECRET=")
	up := startUp(t, cmd)

	url := waitEndpoint(t, &up.stdout, up.done)
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
	if n := strings.Count(up.stderr.String(), "kv_secret=true"); n != 2 {
		t.Errorf("%d engines started with a KV secret, want 2", n)
	}
	pids := childPIDs(up.stderr.String())
	if len(pids) != 2 {
		t.Fatalf("engine pids %v, want prefill-0 and decode-0", pids)
	}

	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-up.done:
	case <-time.After(30 * time.Second):
		t.Fatal("tandem up did not exit within 30s of SIGINT")
	}
	if up.err != nil {
		t.Errorf("tandem up exited with %v after SIGINT, want 0", up.err)
	}
	if strings.Contains(up.stderr.String(), `msg="engine exited`) {
		t.Error("the engines' exits on the shutdown's SIGTERM were taken for crashes")
	}
	checkGone(t, pids)
}
