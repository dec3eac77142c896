package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// FreePorts returns n distinct loopback ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns a loopback port that was free a moment ago. A server
// that loses it to another process before binding fails with "address
// already in use"; tests that start processes retry with a new port.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// StartLogged starts cmd, a server a test runs, with its output in the
// file log, and kills it when the test ends; on Linux it also dies with
// the test binary. Exited receives the process's end, once.
func StartLogged(t testing.TB, cmd *exec.Cmd, log string) (exited <-chan error) {
	t.Helper()
	logf, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(fmt.Errorf("starting %s: %w", cmd.Path, err))
	}
	done := make(chan error, 1)
	ended := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		done <- err
		ended <- err
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		logf.Close()
	})
	return ended
}

// WaitStarted polls ready every 100 ms until it reports true, for a server
// StartLogged started with its output in log. It fails the test when the
// server exits first (exited, StartLogged's channel) or is still not ready
// after limit, with the end of the log; name says which server, as in
// "promtest: prometheus".
func WaitStarted(t testing.TB, name string, exited <-chan error, log string, limit time.Duration, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ready() {
		select {
		case err := <-exited:
			t.Fatalf("%s exited before it was ready (%v):\n%s", name, err, LogTail(log))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v:\n%s", name, limit, LogTail(log))
		}
	}
}

// LogTail returns the last 4,000 bytes of the file at path, for a failing
// test's message.
func LogTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
