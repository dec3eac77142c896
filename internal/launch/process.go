package launch

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// child is one supervised process.
type child struct {
	name string
	cmd  *exec.Cmd
	logs *lineRelay
	done chan struct{} // closed once the process has been waited for
	err  error         // Wait's result, readable after done
}

// startPinned starts cmd with its CPU affinity set to cpus from birth.
//
// The affinity of a new process is that of the thread that forked it. So the
// fork happens on a goroutine locked to its thread, whose mask is narrowed
// to cpus just for the fork and restored right after. Meanwhile no other
// goroutine can run on that thread (it is locked), and the Go runtime never
// clones new threads from a locked one (it asks its template thread), so the
// narrowed mask cannot leak into the parent's other threads.
func startPinned(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	var want unix.CPUSet
	for _, c := range cpus {
		want.Set(c)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading CPU affinity: %w", err)
			return
		}
		if err := unix.SchedSetaffinity(0, &want); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("pinning to CPUs %v: %w", cpus, err)
			return
		}
		startErr := cmd.Start()
		if err := unix.SchedSetaffinity(0, &old); err != nil {
			// The thread keeps the narrow mask: stay locked so that the
			// goroutine's exit retires the thread with it. That also
			// delivers Pdeathsig to the child, so stop it and say why.
			if startErr == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			errc <- fmt.Errorf("restoring CPU affinity after starting a child: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- startErr
	}()
	return <-errc
}

// describeExit says how a child ended, e.g. "exited with status 2" or
// "was killed by signal killed".
func describeExit(err error) string {
	if err == nil {
		return "exited with status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by signal " + ws.Signal().String()
		}
		return fmt.Sprintf("exited with status %d", ee.ExitCode())
	}
	return "failed: " + err.Error()
}

// report says which child ended, how and when ("during startup"), that the
// others are being stopped, and its last log lines.
func (c *child) report(when string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s%s; stopping the others", c.name, describeExit(c.err), when)
	if last := c.logs.Last(); len(last) > 0 {
		fmt.Fprintf(&b, "; its last log lines:\n")
		for _, l := range last {
			fmt.Fprintf(&b, "  [%s] %s\n", c.name, l)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// stopAll sends SIGTERM to every running child, waits up to grace for them
// to exit, then SIGKILLs the rest and waits for them.
func stopAll(children []*child, grace time.Duration) {
	for _, c := range children {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	timeout := time.NewTimer(grace)
	defer timeout.Stop()
wait:
	for _, c := range children {
		select {
		case <-c.done:
		case <-timeout.C:
			break wait
		}
	}
	for _, c := range children {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}
