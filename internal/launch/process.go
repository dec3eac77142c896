package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ProcessSpec is one child process for Start.
type ProcessSpec struct {
	// Name names the process in its log lines and in errors ("prefill-0",
	// "proxy").
	Name string
	// Path is the program and Args its arguments (after the program name).
	Path string
	Args []string
	// Env is added to this process's environment, after GOMAXPROCS set to
	// the number of CPUs (see Env).
	Env []string
	// CPUs are the cores the process is pinned to from birth; none leaves
	// it unpinned.
	CPUs []int
	// URL is the base URL whose /health WaitHealthy polls.
	URL string
	// LogFile, if set, is created (truncated) and receives the process's
	// output. Otherwise every line goes to Output as "[Name] line", in one
	// Write per line; Output nil discards it.
	LogFile string
	Output  io.Writer
}

// Process is a child that Start started. Its own process group keeps a
// terminal's Ctrl-C from reaching it (its parent stops it, in order), and
// the kernel kills it with SIGKILL if its parent dies first.
type Process struct {
	// Name, URL and LogFile are the spec's.
	Name, URL, LogFile string
	cmd                *exec.Cmd
	logs               *lineRelay // nil with a log file
	done               chan struct{}
	err                error // Wait's result, readable after done
}

// Start starts the process s describes and reaps it in the background.
func Start(s ProcessSpec) (*Process, error) {
	p := &Process{Name: s.Name, URL: s.URL, LogFile: s.LogFile, done: make(chan struct{})}
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Env = append(Env(EngineSpec{CPUs: s.CPUs}, os.Environ()), s.Env...)
	if s.LogFile != "" {
		f, err := os.Create(s.LogFile)
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", s.Name, err)
		}
		defer f.Close() // the child has its own descriptor
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		p.logs = newLineRelay(s.Name, orDiscard(s.Output))
		cmd.Stdout, cmd.Stderr = p.logs, p.logs
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second // don't hang on pipes held by a grandchild
	if err := startPinned(cmd, s.CPUs); err != nil {
		return nil, fmt.Errorf("starting %s (%s %s): %w", s.Name, s.Path, strings.Join(s.Args, " "), err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		if p.logs != nil {
			p.logs.Flush()
		}
		close(p.done)
	}()
	return p, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited says whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (exec.Cmd.Wait's error); valid after Done.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// LastLines are the last lines the process wrote (at most 20), oldest
// first.
func (p *Process) LastLines() []string {
	if p.logs != nil {
		return p.logs.Last()
	}
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return nil
	}
	lines := strings.Split(string(bytes.TrimRight(b, "\n")), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	return lines[max(0, len(lines)-logKeep):]
}

// Report says how the process ended and when ("during startup"), that the
// others are being stopped, its last log lines and its log file.
func (p *Process) Report(when string) string {
	return p.report(fmt.Sprintf("%s %s%s", p.Name, describeExit(p.err), when))
}

// report is Report with its own first clause.
func (p *Process) report(head string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s; stopping the others", head)
	if last := p.LastLines(); len(last) > 0 {
		fmt.Fprintf(&b, "; its last log lines:\n")
		for _, l := range last {
			fmt.Fprintf(&b, "  [%s] %s\n", p.Name, l)
		}
	}
	if p.LogFile != "" {
		fmt.Fprintf(&b, "(see %s)", p.LogFile)
	}
	return strings.TrimRight(b.String(), "\n")
}

// ErrNotHealthy is wrapped by WaitHealthy's error when a process was not
// healthy in time.
var ErrNotHealthy = errors.New("not healthy")

// WaitHealthy polls the /health of every process until all answer 200. It
// fails at once, with the process's Report, when one exits first (a bad
// model directory, a port taken) rather than waiting out timeout; when
// timeout passes it names those still waiting, wrapping ErrNotHealthy.
func WaitHealthy(ctx context.Context, procs []*Process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exited := make(chan *Process, len(procs))
	for _, p := range procs {
		go func() {
			select {
			case <-p.done:
				exited <- p
			case <-ctx.Done():
			}
		}()
	}
	client := &http.Client{Timeout: 2 * time.Second}
	ready := make([]bool, len(procs))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for i, p := range procs {
			if !ready[i] {
				ready[i] = healthy(ctx, client, p.URL)
				all = all && ready[i]
			}
		}
		if all {
			return nil
		}
		select {
		case p := <-exited:
			return errors.New(p.Report(" during startup"))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				var waiting []string
				for i, p := range procs {
					if !ready[i] {
						waiting = append(waiting, p.Name)
					}
				}
				return fmt.Errorf("%s %w after %v", strings.Join(waiting, ", "), ErrNotHealthy, timeout)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func healthy(ctx context.Context, client *http.Client, base string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Stop stops every process still running: SIGCONT (a stopped process
// cannot exit) and SIGTERM, then, after grace in all, SIGKILL to the rest;
// it returns once all have been reaped.
func Stop(procs []*Process, grace time.Duration) {
	for _, p := range procs {
		if !p.Exited() {
			_ = p.Signal(syscall.SIGCONT)
			_ = p.Signal(syscall.SIGTERM)
		}
	}
	timeout := time.NewTimer(grace)
	defer timeout.Stop()
wait:
	for _, p := range procs {
		select {
		case <-p.done:
		case <-timeout.C:
			break wait
		}
	}
	for _, p := range procs {
		if !p.Exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// schedSetaffinity is unix.SchedSetaffinity; a test replaces it to make
// restoring the mask fail.
var schedSetaffinity = unix.SchedSetaffinity

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
		if err := schedSetaffinity(0, &want); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("pinning to CPUs %v: %w", cpus, err)
			return
		}
		startErr := cmd.Start()
		if err := schedSetaffinity(0, &old); err != nil {
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
