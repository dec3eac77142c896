package main

// The processes of the bench experiments: engines and proxies started
// pinned to cores, supervised and stopped, and the host's load average
// sampled while they run.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/launch"
)

// startColocated starts one engine on every allowed CPU.
func (x *experiment) startColocated(ctx context.Context, mnbt int) (string, []string, error) {
	ports, err := launch.FreePorts("127.0.0.1", 2)
	if err != nil {
		return "", nil, err
	}
	s := launch.EngineSpec{Name: fmt.Sprintf("colocated-mnbt%d", mnbt), Host: "127.0.0.1", Port: ports[0], KVPort: ports[1], CPUs: x.cpus}
	args := launch.ServeArgs(s, x.model, filepath.Base(x.model), append([]string{"--max-num-batched-tokens", strconv.Itoa(mnbt)}, x.extra...))
	// A colocated engine has no role: drop "--role ''".
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--role" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	c, err := x.start(s, args)
	if err != nil {
		return "", nil, err
	}
	return s.URL(), nil, c.waitHealthy(ctx, 10*time.Minute)
}

// startPD starts a prefill and a decode engine on half the CPUs each and a
// tandem proxy in front of them with proxyArgs; name prefixes their log
// files.
func (x *experiment) startPD(ctx context.Context, name string, proxyArgs ...string) (string, []string, error) {
	c, err := x.startCluster(ctx, name, 1, 1, proxyArgs...)
	if err != nil {
		return "", nil, err
	}
	return c.url, c.metricsURLs, nil
}

// cluster is prefill and decode engines behind a tandem proxy process.
type cluster struct {
	url string
	// metricsURLs are the proxy's and the engines' URLs.
	metricsURLs []string
	proxy       *child
}

// startCluster starts prefill and decode engines, the cores split among
// them as tandem up splits them (more engines than cores: one core each,
// shared round-robin), and a tandem proxy process on every core in front of
// them with proxyArgs; name prefixes their log files.
func (x *experiment) startCluster(ctx context.Context, name string, prefill, decode int, proxyArgs ...string) (*cluster, error) {
	n := prefill + decode
	cores, err := launch.SplitCores(x.cpus, n, 0)
	if err != nil {
		return nil, err
	}
	ports, err := launch.FreePorts("127.0.0.1", 2*n+1)
	if err != nil {
		return nil, err
	}
	specs, err := launch.PlanEngines("127.0.0.1", prefill, decode, cores, ports[:2*n])
	if err != nil {
		return nil, err
	}
	var engines []*child
	for i := range specs {
		specs[i].Name = name + "-" + specs[i].Name
		c, err := x.start(specs[i], launch.ServeArgs(specs[i], x.model, filepath.Base(x.model), x.extra))
		if err != nil {
			return nil, err
		}
		engines = append(engines, c)
	}
	for _, c := range engines {
		if err := c.waitHealthy(ctx, 10*time.Minute); err != nil {
			return nil, err
		}
	}
	var prefillURLs, decodeURLs []string
	for _, s := range specs {
		if s.Role == launch.RolePrefill {
			prefillURLs = append(prefillURLs, s.URL())
		} else {
			decodeURLs = append(decodeURLs, s.URL())
		}
	}
	proxy := launch.EngineSpec{Name: name + "-proxy", Host: "127.0.0.1", Port: ports[2*n], CPUs: x.cpus}
	pc, err := x.start(proxy, append([]string{"proxy", "--host", "127.0.0.1", "--port", strconv.Itoa(proxy.Port),
		"--prefill", strings.Join(prefillURLs, ","), "--decode", strings.Join(decodeURLs, ",")}, proxyArgs...))
	if err != nil {
		return nil, err
	}
	if err := pc.waitHealthy(ctx, time.Minute); err != nil {
		return nil, err
	}
	c := &cluster{url: proxy.URL(), metricsURLs: append([]string{proxy.URL()}, append(prefillURLs, decodeURLs...)...), proxy: pc}
	return c, nil
}

// child is a process the experiment started.
type child struct {
	name, url, log string
	cmd            *exec.Cmd
	exited         chan struct{} // closed once cmd.Wait returned, err set
	err            error
}

// waitHealthy waits until the child's /health answers 200, for at most
// limit; it gives up at once, naming the log's last line, when the child
// exits first (a bad model directory, a port taken), rather than waiting
// out the limit.
func (c *child) waitHealthy(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := waitHealth(ctx, c.url, limit)
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited before it was healthy (%v): %s (see %s)", c.name, c.err, lastLine(c.log), c.log)
	default:
		return err
	}
}

// lastLine is the last non-empty line of the file at path.
func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// start starts one child process pinned to s.CPUs, its output in
// OUT/logs/NAME.log.
func (x *experiment) start(s launch.EngineSpec, args []string) (*child, error) {
	logPath := filepath.Join(x.out, "logs", s.Name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(x.exe, args...)
	cmd.Env = append(launch.Env(s, os.Environ()), kvxfer.SecretEnv+"="+x.secret)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startPinned(cmd, s.CPUs); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	logf.Close() // the child has its own descriptor
	x.logf("started %s (pid %d) on %s, CPUs %v", s.Name, cmd.Process.Pid, s.URL(), s.CPUs)
	c := &child{name: s.Name, url: s.URL(), log: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	x.procs = append(x.procs, c)
	return c, nil
}

// stopAll stops every child this experiment started: SIGTERM, then SIGKILL
// after 10 s.
func (x *experiment) stopAll() {
	for _, c := range x.procs {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range x.procs {
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	x.procs = nil
}

// startPinned starts cmd with its CPU affinity set to cpus from birth: the
// fork happens on a goroutine locked to its thread whose mask is narrowed
// for the fork and restored after (as internal/launch does).
func startPinned(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	var want, old unix.CPUSet
	for _, c := range cpus {
		want.Set(c)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := unix.SchedSetaffinity(0, &want); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		err := cmd.Start()
		if unix.SchedSetaffinity(0, &old) != nil {
			errc <- err // stay locked: the thread exits with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

func waitHealth(ctx context.Context, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %v (see the logs directory)", url, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// loadStats is the 1-minute load average sampled during a workload.
type loadStats struct {
	Min     float64 `json:"min"`
	Mean    float64 `json:"mean"`
	Max     float64 `json:"max"`
	Samples int     `json:"samples"`
}

func (l loadStats) String() string {
	if l.Samples == 0 {
		return "not available"
	}
	return fmt.Sprintf("min %.2f, mean %.2f, max %.2f (%d samples)", l.Min, l.Mean, l.Max, l.Samples)
}

// loadAvg1 is the 1-minute load average from /proc/loadavg.
func loadAvg1() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

func loadAvgText() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "not available"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "not available"
	}
	return strings.Join(f[:3], " ") + " (1, 5, 15 min)"
}

type loadSampler struct {
	done  chan struct{}
	stats chan loadStats
}

// startLoadSampler samples the load average now and every period until
// stop.
func startLoadSampler(period time.Duration) *loadSampler {
	ls := &loadSampler{done: make(chan struct{}), stats: make(chan loadStats, 1)}
	go func() {
		var st loadStats
		var sum float64
		sample := func() {
			v, ok := loadAvg1()
			if !ok {
				return
			}
			if st.Samples == 0 || v < st.Min {
				st.Min = v
			}
			st.Max = max(st.Max, v)
			sum += v
			st.Samples++
		}
		sample()
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				sample()
			case <-ls.done:
				sample()
				if st.Samples > 0 {
					st.Mean = sum / float64(st.Samples)
				}
				ls.stats <- st
				return
			}
		}
	}()
	return ls
}

func (ls *loadSampler) stop() loadStats {
	close(ls.done)
	return <-ls.stats
}
