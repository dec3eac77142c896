package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
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
