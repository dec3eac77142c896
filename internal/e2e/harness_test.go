package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// Limits on waiting. Every wait in this package is a poll with a deadline;
// none of them is a sleep standing in for synchronisation.
const (
	startTimeout   = 60 * time.Second // process start to healthy, on two busy cores
	requestTimeout = 60 * time.Second // one HTTP exchange, body included
	pollInterval   = 25 * time.Millisecond
	servedName     = "m" // --served-model-name of every engine
)

var (
	workDir   string // removed by TestMain
	buildOnce sync.Once
	binPath   string
	buildErr  error

	client = &http.Client{Timeout: requestTimeout}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tandem-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	workDir = dir
	if os.Getenv("TANDEM_KERNELS") == "" {
		// The engines' kernels as this process's (CPUID's choice, no
		// timing): the tests compare the engines' outputs bit for bit
		// with what this process computes.
		os.Setenv("TANDEM_KERNELS", "cpuid")
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tandem returns the path of the tandem binary, built once per test run
// (lazily, so -short and -run filters that need no process build nothing).
func tandem(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts the tandem binary as separate processes; skipped in -short mode")
	}
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out := filepath.Join(workDir, "tandem")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/tandem-serve/tandem/cmd/tandem")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tandem: %v\n%s", err, b)
			return
		}
		binPath = out
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// requirePD fails the test when `tandem serve` lacks --role, --kv-host,
// --kv-port or any of more: a binary without the P/D flags cannot run these
// tests, and that must not pass as a skip.
func requirePD(t *testing.T, bin string, more ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	help, _ := exec.CommandContext(ctx, bin, "serve", "-h").CombinedOutput()
	var missing []string
	for _, f := range append([]string{"--role", "--kv-host", "--kv-port"}, more...) {
		// The flag package prints "  -name type".
		if !bytes.Contains(help, []byte(f[1:]+" ")) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("`tandem serve` lacks %s (the P/D serve flags)", strings.Join(missing, ", "))
	}
}

// tail is the last max bytes of s, cut at a line start.
func tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[len(s)-max:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "…\n" + s
}

// proc is one child process in its own process group.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer // stdout and stderr
	done chan struct{}
	err  error // Wait's result, set before done closes
}

// startProc starts bin with args. The process (and any child it starts) is
// killed with SIGKILL in t.Cleanup, and its output is printed if t failed.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv is startProc with env (KEY=value entries) added to the
// test's environment; an entry overrides an inherited one of the same key,
// and KEY= unsets it as far as tandem is concerned (it reads empty
// variables as absent). Secrets go to the processes this way, never into
// the test process's own environment, so one test's engines cannot leak a
// secret into another's.
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(tandem(t), args...)
	if len(env) > 0 {
		// exec uses the last value of a duplicated key.
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A group of its own, so the kill reaches grandchildren too; Pdeathsig
	// so that a test binary killed by -timeout leaves no engine behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, strings.Join(args, " "), tail(p.out.String(), 6000))
		}
	})
	return p
}

// kill sends SIGKILL to p's process group and waits for p to exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// errPortClash marks a process that could not bind the port it was given
// (another process took it between testutil.FreePort and the bind).
var errPortClash = errors.New("port clash")

// waitHealthy polls url+"/health" until it answers 200, p exits or
// startTimeout passes.
func waitHealthy(p *proc, url string) error {
	deadline := time.Now().Add(startTimeout)
	probe := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if p.exited() {
			if strings.Contains(p.out.String(), "address already in use") {
				return errPortClash
			}
			return fmt.Errorf("%s exited before it was healthy (%v)", p.name, p.err)
		}
		resp, err := probe.Get(url + "/health")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy at %s/health after %v (last error %v)", p.name, url, startTimeout, err)
		}
		select {
		case <-tick.C:
		case <-p.done:
		}
	}
}

// engine is one `tandem serve` process.
type engine struct {
	*proc
	spec   engineSpec
	url    string
	kvPort int
}

// engineSpec says how to start an engine. Port and KVPort 0 mean "pick
// free ones"; fixed ports (a restart on the same ports) are not retried.
type engineSpec struct {
	name   string
	model  string
	role   string // "" for an engine started without --role (colocated: "both")
	port   int
	kvPort int
	args   []string // more flags, after the ones startEngine sets
	env    []string // more environment variables (KEY=value), see startProcEnv
}

// Defaults for every engine: one compute thread each (the tests run many
// processes on two cores) and a small pool so that a leaked block shows up
// in vllm:kv_cache_usage_perc.
var engineDefaults = []string{"--threads", "1", "--num-blocks", "64"}

func startEngine(t *testing.T, s engineSpec) *engine {
	t.Helper()
	for attempt := 1; ; attempt++ {
		port, kvPort := s.port, s.kvPort
		if port == 0 {
			port = testutil.FreePort(t)
		}
		if kvPort == 0 {
			kvPort = testutil.FreePort(t)
		}
		p := startProcEnv(t, s.name, s.env, engineArgs(s, port, kvPort)...)
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		err := waitHealthy(p, url)
		if err == nil {
			return &engine{proc: p, spec: s, url: url, kvPort: kvPort}
		}
		if errors.Is(err, errPortClash) && s.port == 0 && s.kvPort == 0 && attempt < 3 {
			t.Logf("%s: port clash, retrying with new ports", s.name)
			continue
		}
		t.Fatalf("start %s: %v\n%s", s.name, err, tail(p.out.String(), 4000))
	}
}

// engineArgs are the arguments of `tandem serve` for s on the given ports.
func engineArgs(s engineSpec, port, kvPort int) []string {
	// Every engine gets a side-channel port of its own: one started
	// without --role is "both" and listens on the default 5600, which
	// another test's engine (or anything else) may hold.
	args := []string{"serve", "--model", s.model, "--served-model-name", servedName,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--kv-host", "127.0.0.1", "--kv-port", strconv.Itoa(kvPort)}
	if s.role != "" {
		args = append(args, "--role", s.role)
	}
	return append(append(args, engineDefaults...), s.args...)
}

// startEngines starts the engines of specs (free ports each) all at once,
// so that a cluster takes as long to start as its slowest engine; one that
// lost a port to another process starts again as startEngine does.
func startEngines(t *testing.T, specs ...engineSpec) []*engine {
	t.Helper()
	out := make([]*engine, len(specs))
	for i, s := range specs {
		port, kvPort := testutil.FreePort(t), testutil.FreePort(t)
		out[i] = &engine{proc: startProcEnv(t, s.name, s.env, engineArgs(s, port, kvPort)...), spec: s,
			url: "http://127.0.0.1:" + strconv.Itoa(port), kvPort: kvPort}
	}
	for i, e := range out {
		err := waitHealthy(e.proc, e.url)
		switch {
		case errors.Is(err, errPortClash):
			t.Logf("%s: port clash, retrying with new ports", e.name)
			out[i] = startEngine(t, specs[i])
		case err != nil:
			t.Fatalf("start %s: %v\n%s", e.name, err, tail(e.out.String(), 4000))
		}
	}
	return out
}

// restart kills e and starts the same engine on the same ports (a new
// process, so a new engine id).
func (e *engine) restart(t *testing.T) *engine {
	t.Helper()
	e.kill(t)
	s := e.spec
	s.port, _ = strconv.Atoi(e.url[strings.LastIndexByte(e.url, ':')+1:])
	s.kvPort = e.kvPort
	s.name += " (restarted)"
	return startEngine(t, s)
}

// startProxy starts `tandem proxy` in front of the given engines, with a
// short health interval so that the fault tests see a dead or restarted
// prefill quickly, and returns its URL.
func startProxy(t *testing.T, name string, prefill, decode []*engine, args ...string) string {
	t.Helper()
	return startStoppableProxy(t, name, prefill, decode, args...).url
}

// stoppableProxy is a `tandem proxy` process, which the test can stop
// itself, and its URL.
type stoppableProxy struct {
	*proc
	url string
}

// startStoppableProxy is startProxy, keeping the process so that the test can
// stop it gracefully.
func startStoppableProxy(t *testing.T, name string, prefill, decode []*engine, args ...string) *stoppableProxy {
	t.Helper()
	urls := func(es []*engine) string {
		var s []string
		for _, e := range es {
			s = append(s, e.url)
		}
		return strings.Join(s, ",")
	}
	for attempt := 1; ; attempt++ {
		port := testutil.FreePort(t)
		p := startProc(t, name, append([]string{"proxy", "--prefill", urls(prefill), "--decode", urls(decode),
			"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--health-interval", "200ms", "--timeout", "30s",
			"--policy", "round-robin", "--pd-decider", "always"}, args...)...) // the P/D path these tests check; args may override
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		err := waitHealthy(p, url)
		if err == nil {
			return &stoppableProxy{proc: p, url: url}
		}
		if errors.Is(err, errPortClash) && attempt < 3 {
			continue
		}
		t.Fatalf("start %s: %v\n%s", name, err, tail(p.out.String(), 4000))
	}
}

// reply is one HTTP answer, read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// pd is the proxy's x-tandem-pd header.
func (r reply) pd() string { return r.header.Get("X-Tandem-Pd") }

func postJSON(t *testing.T, url string, body any) reply {
	t.Helper()
	r, err := tryPostJSON(url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryPostJSON(url string, body any) (reply, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	resp, err := client.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: reading the body: %w", url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}, nil
}

// metrics is one scrape of a Prometheus text endpoint: series (the text
// before the value, e.g. `vllm:x{model_name="m",source="y"}`) to value.
type metrics map[string]float64

func scrape(t *testing.T, url string) metrics {
	t.Helper()
	m, err := tryScrape(url)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tryScrape(url string) (metrics, error) {
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", url, resp.Status)
	}
	m := metrics{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("GET %s/metrics: bad line %q", url, line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s/metrics: bad value in %q", url, line)
		}
		m[line[:i]] = v
	}
	return m, nil
}

// get sums the series of the metric name whose labels include all of
// labels (each `key="value"`), and says whether there was any.
func (m metrics) get(name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for series, v := range m {
		n, ls, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(ls, l)
		}
		if ok {
			sum += v
			found = true
		}
	}
	return sum, found
}

// must is get for a series that has to exist.
func (m metrics) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := m.get(name, labels...)
	if !ok {
		t.Fatalf("metric %s%v missing from the scrape", name, labels)
	}
	return v
}

// waitPoolsIdle polls until every engine's KV pool is empty again
// (vllm:kv_cache_usage_perc 0; prefill engines also hold no leased blocks).
// Releases are asynchronous (a DONE frees the prefill's blocks in its next
// step), hence the poll. Its 10s bound is well inside the default 30s
// lease, so blocks that only a lease expiry would free (a missing DONE)
// fail the test.
func waitPoolsIdle(t *testing.T, engines ...*engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for _, e := range engines {
		var last string
		for {
			m, err := tryScrape(e.url)
			if err == nil {
				usage, okU := m.get("vllm:kv_cache_usage_perc")
				held, okH := m.get("tandem:kv_blocks_held")
				switch {
				case !okU:
					t.Fatalf("%s: no vllm:kv_cache_usage_perc in /metrics", e.name)
				case e.spec.role == "prefill" && !okH:
					t.Fatalf("%s: no tandem:kv_blocks_held in /metrics", e.name)
				case usage == 0 && held == 0:
				default:
					last = fmt.Sprintf("kv_cache_usage_perc %v, kv_blocks_held %v", usage, held)
					err = errors.New(last)
				}
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: KV pool not empty 10s after the last request: %v", e.name, err)
				break
			}
			<-tick.C
		}
	}
}
