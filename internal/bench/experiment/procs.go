package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/launch"
)

// Limits on a process becoming healthy: a large model loads slowly on a
// CPU; a proxy only has to listen.
const (
	engineStartup = 10 * time.Minute
	proxyStartup  = time.Minute
	// stopGrace is how long the processes get to exit after SIGTERM.
	stopGrace = 10 * time.Second
)

// procs starts an experiment's processes, pinned, with the KV secret they
// share and their output in OUT/logs/NAME.log, and stops them together.
type procs struct {
	exe, out string
	extra    []string // every engine's extra `tandem serve` flags
	cpus     []int    // the cores the processes may use
	env      []string
	log      io.Writer
	prefix   string // of the log lines: "experiment", "soak"
	running  []*launch.Process
}

// newProcs creates OUT/logs and finds the CPUs the processes may use.
func newProcs(c *Common, prefix string) (*procs, error) {
	c.defaults()
	if err := os.MkdirAll(filepath.Join(c.Out, "logs"), 0o755); err != nil {
		return nil, err
	}
	cpus, err := launch.AllowedCPUs()
	if err != nil {
		return nil, err
	}
	return &procs{exe: c.Executable, out: c.Out, extra: c.EngineArgs, cpus: cpus, env: []string{kvxfer.SecretEnv + "=" + secret()},
		log: c.Log, prefix: prefix}, nil
}

func (x *procs) logf(format string, args ...any) {
	fmt.Fprintf(x.log, x.prefix+": "+format+"\n", args...)
}

func (x *procs) logDir() string { return filepath.Join(x.out, "logs") }

// start starts one process pinned to cpus, its output in OUT/logs/LOGFILE.
func (x *procs) start(name string, cpus []int, url string, args []string, logFile string) (*launch.Process, error) {
	p, err := launch.Start(launch.ProcessSpec{Name: name, Path: x.exe, Args: args, Env: x.env, CPUs: cpus, URL: url,
		LogFile: filepath.Join(x.logDir(), logFile)})
	if err != nil {
		return nil, err
	}
	x.logf("started %s (pid %d) on %s, CPUs %v", name, p.PID(), url, cpus)
	x.running = append(x.running, p)
	return p, nil
}

// waitHealthy waits until every process of ps is healthy, for at most
// limit, failing at once when one exits first.
func (x *procs) waitHealthy(ctx context.Context, ps []*launch.Process, limit time.Duration) error {
	err := launch.WaitHealthy(ctx, ps, limit)
	if errors.Is(err, launch.ErrNotHealthy) {
		return fmt.Errorf("%w (see the logs directory %s)", err, x.logDir())
	}
	return err
}

// stopAll stops every process started so far: SIGTERM, then SIGKILL after
// 10 s.
func (x *procs) stopAll() {
	launch.Stop(x.running, stopGrace)
	x.running = nil
}

// startColocated starts one engine on every allowed CPU with mnbt as its
// --max-num-batched-tokens and, unless interval is 0, interval as its
// --prefill-schedule-interval; the engine and its log file are named after
// both, so a cadence engine at interval 1 is not the plain one.
func (x *procs) startColocated(ctx context.Context, model string, mnbt, interval int) (string, error) {
	ports, err := launch.FreePorts("127.0.0.1", 2)
	if err != nil {
		return "", err
	}
	name, flags := colocatedFlags(mnbt, interval)
	s := launch.EngineSpec{Name: name, Host: "127.0.0.1", Port: ports[0], KVPort: ports[1], CPUs: x.cpus}
	args := launch.ServeArgs(s, model, filepath.Base(model), append(flags, x.extra...))
	// A colocated engine has no role: drop "--role ''".
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--role" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	p, err := x.start(s.Name, s.CPUs, s.URL(), args, s.Name+".log")
	if err != nil {
		return "", err
	}
	return s.URL(), x.waitHealthy(ctx, []*launch.Process{p}, engineStartup)
}

// colocatedFlags are a colocated engine's name and its `tandem serve`
// flags for chunk budget mnbt and, unless interval is 0, prefill cadence
// interval.
func colocatedFlags(mnbt, interval int) (name string, flags []string) {
	name, flags = fmt.Sprintf("colocated-mnbt%d", mnbt), []string{"--max-num-batched-tokens", strconv.Itoa(mnbt)}
	if interval > 0 {
		name += fmt.Sprintf("-interval%d", interval)
		flags = append(flags, "--prefill-schedule-interval", strconv.Itoa(interval))
	}
	return name, flags
}

// cluster is prefill and decode engines behind a tandem proxy process.
type cluster struct {
	url string
	// metricsURLs are the proxy's and the engines' URLs.
	metricsURLs []string
	proxy       *launch.Process
	// engines are the engines' specs and processes, prefill first.
	engines []clusterEngine
}

// clusterEngine is one engine of a cluster.
type clusterEngine struct {
	spec launch.EngineSpec
	args []string
	proc *launch.Process
}

// startCluster starts prefill and decode engines serving model, the cores
// split among them as tandem up splits them (more engines than cores: one
// core each, shared round-robin), and a tandem proxy process on every core
// in front of them with proxyArgs. name, when set, prefixes their names
// and log files.
func (x *procs) startCluster(ctx context.Context, model, servedName, name string, prefill, decode int, proxyArgs ...string) (*cluster, error) {
	return x.startClusterWith(ctx, model, servedName, clusterOpts{name: name, prefill: prefill, decode: decode, proxyArgs: proxyArgs})
}

// clusterOpts say what startClusterWith starts.
type clusterOpts struct {
	// name, when set, prefixes the processes' names and log files.
	name string
	// prefill and decode are the pools' sizes. With no prefill engine the
	// proxy is given only --decode: colocated engines behind a router (its
	// decider must keep prompts local: conditional or priced), from which
	// an acting planner may move engines into a prefill pool.
	prefill, decode int
	// role, unless "", is every engine's --role instead of its pool's:
	// launch.RoleBoth for a proxy whose planner moves engines between the
	// pools, as tandem up starts them with the SLO flags (the proxy still
	// lists the first prefill engines under --prefill and the rest under
	// --decode).
	role string
	// engineArgs go on every engine's command line before the
	// experiment's own extra flags (which win).
	engineArgs []string
	// proxyArgs go on the proxy's command line after its defaults.
	proxyArgs []string
}

// startClusterWith starts the engines and the proxy o describes: the
// cores split among the engines as tandem up splits them (more engines
// than cores: one core each, shared round-robin), the proxy on every core.
func (x *procs) startClusterWith(ctx context.Context, model, servedName string, o clusterOpts) (*cluster, error) {
	n := o.prefill + o.decode
	cores, err := launch.SplitCores(x.cpus, n, 0)
	if err != nil {
		return nil, err
	}
	ports, err := launch.FreePorts("127.0.0.1", 2*n+1)
	if err != nil {
		return nil, err
	}
	specs, err := launch.PlanEngines("127.0.0.1", o.prefill, o.decode, cores, ports[:2*n])
	if err != nil {
		return nil, err
	}
	prefix := ""
	if o.name != "" {
		prefix = o.name + "-"
	}
	c := &cluster{}
	var engines []*launch.Process
	extra := append(slices.Clip(o.engineArgs), x.extra...)
	for _, s := range specs {
		s.Name = prefix + s.Name
		as := s
		if o.role != "" {
			as.Role = o.role
		}
		args := launch.ServeArgs(as, model, servedName, extra)
		p, err := x.start(s.Name, s.CPUs, s.URL(), args, s.Name+".log")
		if err != nil {
			return nil, err
		}
		c.engines = append(c.engines, clusterEngine{spec: s, args: args, proc: p})
		engines = append(engines, p)
	}
	if err := x.waitHealthy(ctx, engines, engineStartup); err != nil {
		return nil, err
	}
	var prefillURLs, decodeURLs []string
	for _, e := range c.engines {
		if e.spec.Role == launch.RolePrefill {
			prefillURLs = append(prefillURLs, e.spec.URL())
		} else {
			decodeURLs = append(decodeURLs, e.spec.URL())
		}
	}
	proxy := launch.EngineSpec{Name: prefix + "proxy", Host: "127.0.0.1", Port: ports[2*n], CPUs: x.cpus}
	backends := []string{"--decode", strings.Join(decodeURLs, ",")}
	if len(prefillURLs) > 0 {
		backends = append([]string{"--prefill", strings.Join(prefillURLs, ",")}, backends...)
	}
	// Round-robin and always unless proxyArgs say otherwise (a later flag
	// wins): the experiments' baseline P/D and the ratio model's dispatch,
	// whatever tandem proxy's own defaults are.
	args := append([]string{"proxy", "--host", "127.0.0.1", "--port", strconv.Itoa(proxy.Port)}, backends...)
	args = append(append(args, "--policy", "round-robin", "--pd-decider", "always"), o.proxyArgs...)
	pc, err := x.start(proxy.Name, proxy.CPUs, proxy.URL(), args, proxy.Name+".log")
	if err != nil {
		return nil, err
	}
	if err := x.waitHealthy(ctx, []*launch.Process{pc}, proxyStartup); err != nil {
		return nil, err
	}
	c.url, c.proxy = proxy.URL(), pc
	c.metricsURLs = append([]string{proxy.URL()}, append(prefillURLs, decodeURLs...)...)
	return c, nil
}

// stopCluster stops c's proxy and engines (SIGTERM, then SIGKILL after
// stopGrace) and forgets them, leaving x's other processes running.
func (x *procs) stopCluster(c *cluster) {
	ps := []*launch.Process{c.proxy}
	for _, e := range c.engines {
		ps = append(ps, e.proc)
	}
	launch.Stop(ps, stopGrace)
	x.running = slices.DeleteFunc(x.running, func(p *launch.Process) bool { return slices.Contains(ps, p) })
}
