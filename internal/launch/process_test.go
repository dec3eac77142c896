package launch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestStartPinnedPinsEveryThread(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs to tell a pinned child from an unpinned one")
	}
	target := cpus[len(cpus)-1]
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "TANDEM_UP_FAKE=sleep")
	if err := startPinned(cmd, []int{target}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// The Go runtime of the child starts several threads at once; give it
	// a moment, then check all of them. (Pinning the pid after Start also
	// passes this check most of the time: the race it loses is narrow. The
	// test guards against no pinning, a wrong mask and a leaked parent mask.)
	time.Sleep(200 * time.Millisecond)
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) < 2 {
		t.Logf("child has %d threads", len(tasks))
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			t.Fatal(err)
		}
		if set.Count() != 1 || !set.IsSet(target) {
			t.Errorf("thread %d of the child may run on %d CPUs, want only CPU %d", tid, set.Count(), target)
		}
	}
	// The parent must have its own mask back.
	after, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(cpus, after) {
		t.Errorf("parent's CPUs changed from %v to %v", cpus, after)
	}
}

// TestStartPinnedStopsTheChildWhenRestoringTheMaskFails: when the forking
// thread's mask cannot be restored, the thread must retire with its
// goroutine, and its exit delivers Pdeathsig to the child just started. So
// startPinned must stop that child and fail, not report a start whose
// process the kernel is about to kill.
func TestStartPinnedStopsTheChildWhenRestoringTheMaskFails(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	schedSetaffinity = func(pid int, set *unix.CPUSet) error {
		calls++
		if calls == 2 { // the restore after the fork
			return syscall.EINVAL
		}
		return unix.SchedSetaffinity(pid, set)
	}
	t.Cleanup(func() { schedSetaffinity = unix.SchedSetaffinity })

	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "TANDEM_UP_FAKE=sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = startPinned(cmd, cpus[:1])
	if err == nil || !strings.Contains(err.Error(), "restoring CPU affinity") || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("startPinned = %v, want the failed restore named", err)
	}
	if cmd.ProcessState == nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		t.Fatal("the child was left running (and unreaped) after the failed restore")
	}
	if cmd.ProcessState.Exited() {
		t.Errorf("the child %v, want it killed", cmd.ProcessState)
	}

	// Start passes the failure on and returns no process.
	calls = 0
	if p, err := Start(ProcessSpec{Name: "sleeper", Path: exe, Env: []string{"TANDEM_UP_FAKE=sleep"}, CPUs: cpus[:1]}); err == nil || p != nil {
		t.Errorf("Start = %v, %v; want no process and the error", p, err)
	}
}

// TestStartWithALogFileNamesAnEarlyExit: a process that exits before it is
// healthy fails WaitHealthy at once with its exit, its last log lines and
// its log file, rather than after the timeout.
func TestStartWithALogFileNamesAnEarlyExit(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "decode-0.log")
	p, err := Start(ProcessSpec{Name: "decode-0", Path: exe, Args: []string{"serve", "--role", RoleDecode, "--host", "127.0.0.1", "--port", strconv.Itoa(ports[0])},
		Env: []string{"TANDEM_UP_FAKE=tandem", "TANDEM_UP_FAKE_DIE=" + RoleDecode}, URL: "http://127.0.0.1:" + strconv.Itoa(ports[0]), LogFile: log})
	if err != nil {
		t.Fatal(err)
	}
	defer Stop([]*Process{p}, time.Second)
	start := time.Now()
	err = WaitHealthy(context.Background(), []*Process{p}, time.Minute)
	if err == nil {
		t.Fatal("WaitHealthy succeeded for a process that exited")
	}
	for _, want := range []string{"decode-0 exited with status 3 during startup", "[decode-0] fatal: fake failure to load the model", "(see " + log + ")"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v to notice the exit", d)
	}
}

// TestWaitHealthyNamesTheLateOnes: past the timeout, the error names the
// processes not yet healthy and wraps ErrNotHealthy.
func TestWaitHealthyNamesTheLateOnes(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(ProcessSpec{Name: "sleeper", Path: exe, Env: []string{"TANDEM_UP_FAKE=sleep"}, URL: "http://127.0.0.1:" + strconv.Itoa(ports[0])})
	if err != nil {
		t.Fatal(err)
	}
	defer Stop([]*Process{p}, time.Second)
	err = WaitHealthy(context.Background(), []*Process{p}, 300*time.Millisecond)
	if !errors.Is(err, ErrNotHealthy) || !strings.HasPrefix(err.Error(), "sleeper not healthy after 300ms") {
		t.Errorf("WaitHealthy = %v, want sleeper named as not healthy", err)
	}
}

// TestStopEndsAStoppedProcess: a SIGSTOPped process cannot act on SIGTERM
// until continued, so Stop continues it rather than waiting out the grace
// period for SIGKILL.
func TestStopEndsAStoppedProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(ProcessSpec{Name: "sleeper", Path: exe, Env: []string{"TANDEM_UP_FAKE=sleep"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	Stop([]*Process{p}, time.Minute)
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Stop took %v: the stopped process waited for SIGKILL", d)
	}
	var ee *exec.ExitError
	if !p.Exited() || !errors.As(p.Err(), &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("the process ended with %v, want SIGTERM", p.Err())
	}
}
