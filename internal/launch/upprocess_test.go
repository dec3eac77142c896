package launch

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// upProcess is a `tandem up` process that a test started from the built
// binary.
type upProcess struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{} // closed when the process has exited
	err            error         // cmd.Wait's error, once done is closed
}

// maxLoggedStderr bounds the engines' logs that a failed test shows: the
// tail, where the failure is (200 simulated engines write a lot).
const maxLoggedStderr = 64 << 10

// startUp starts cmd, a `tandem up` command, its output to the process's
// buffers. When the test ends, a process still running gets SIGINT, and
// SIGKILL 30 s later; then every engine it started must be gone, and a
// failed test logs its output. The caller cancels cmd's context with
// t.Cleanup, not defer, so that the shutdown runs first.
func startUp(t *testing.T, cmd *exec.Cmd) *upProcess {
	t.Helper()
	p := &upProcess{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-p.done
			}
		}
		checkGone(t, childPIDs(p.stderr.String()))
		if t.Failed() {
			logs := p.stderr.String()
			if len(logs) > maxLoggedStderr {
				logs = "…" + logs[len(logs)-maxLoggedStderr:]
			}
			t.Logf("tandem up stdout:\n%s\nstderr:\n%s", p.stdout.String(), logs)
		}
	})
	return p
}
