package vllmtest

import (
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// tandemProc is a tandem command (serve or up) running for a test.
type tandemProc struct {
	url string
	log *lockedBuffer
}

// startTandem runs `bin args... --port PORT` in its own process group and
// waits until GET /health answers 200; it is stopped when t ends, and its
// output logged if t failed.
func startTandem(t *testing.T, bin string, timeout time.Duration, args ...string) *tandemProc {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &tandemProc{url: "http://127.0.0.1:" + strconv.Itoa(port), log: &lockedBuffer{}}
	cmd := exec.Command(bin, append(args, "--port", strconv.Itoa(port))...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// tandem up starts engines of its own; the group reaches them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("tandem %v output:\n%s", args, tail(p.log.String(), 8000))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("tandem %v exited before it was healthy:\n%s", args, tail(p.log.String(), 4000))
		case <-ctx.Done():
			t.Fatalf("tandem %v not healthy at %s after %v:\n%s", args, p.url, timeout, tail(p.log.String(), 4000))
		case <-time.After(250 * time.Millisecond):
		}
	}
}
