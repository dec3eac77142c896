package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// engine is one engine of `tandem up`: its spec, which every restart
// reuses (the same command line, so the same ports, and the proxy's backend
// URL stays valid, and the same cores), and its current process.
type engine struct {
	spec ProcessSpec
	role string

	mu   sync.Mutex
	proc *Process
}

func (e *engine) current() *Process {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc
}

func (e *engine) set(p *Process) {
	e.mu.Lock()
	e.proc = p
	e.mu.Unlock()
}

// supervisor restarts the engines of `tandem up` that exit while serving,
// as its RestartPolicy allows.
type supervisor struct {
	policy         RestartPolicy
	startupTimeout time.Duration
	stopTimeout    time.Duration
	log            *slog.Logger
	// changed runs after an engine exited (restarted "") and after a
	// restarted one is healthy (restarted its URL): `tandem up` has the
	// proxy check its backends then, so that it routes around the engine
	// at once and back to it as soon as it answers, rather than at its
	// next periodic check, with the old process's circuit-breaker record
	// forgotten.
	changed func(ctx context.Context, restarted string)
	// exits and restarts count per engine (label "engine").
	exits, restarts *prometheus.CounterVec
}

// newSupervisor makes a supervisor whose counters are registered on reg
// (nil: not registered).
func newSupervisor(policy RestartPolicy, startupTimeout, stopTimeout time.Duration, log *slog.Logger, changed func(ctx context.Context, restarted string), reg prometheus.Registerer) (*supervisor, error) {
	s := &supervisor{
		policy: policy, startupTimeout: startupTimeout, stopTimeout: stopTimeout, log: log, changed: changed,
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:up_engine_exits_total",
			Help: "Engines of tandem up that exited while serving (crashed, killed or ended on their own), by engine.",
		}, []string{"engine"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tandem:up_engine_restarts_total",
			Help: "Engines of tandem up started again after they exited while serving, by engine.",
		}, []string{"engine"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.exits, s.restarts} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering the supervisor's metrics: %w", err)
			}
		}
	}
	return s, nil
}

// watch supervises e until ctx is done (nil: an exit from then on is the
// shutdown's, not a crash) or e exits once more than the policy allows
// restarts, or cannot be started at all (an error naming it, how it ended
// and its last log lines).
func (s *supervisor) watch(ctx context.Context, e *engine) error {
	tr := restartTracker{policy: s.policy}
	name := e.spec.Name
	s.exits.WithLabelValues(name)
	s.restarts.WithLabelValues(name)
	for {
		p := e.current()
		select {
		case <-ctx.Done():
			return nil
		case <-p.Done():
		}
		if ctx.Err() != nil {
			return nil
		}
		s.exits.WithLabelValues(name).Inc()
		exit := describeExit(p.Err())
		wait, ok := tr.exited(time.Now())
		if !ok {
			s.log.Error("engine exited; giving up", "engine", name, "role", e.role, "pid", p.PID(), "exit", exit,
				"restarts", tr.total, "recent_restarts", tr.recent(), "policy", s.policy.String())
			if s.policy.Limit < 0 {
				return errors.New(p.Report(" while serving"))
			}
			return errors.New(p.report(fmt.Sprintf("%s keeps exiting: it %s after %d restarts within %v, %s",
				name, exit, tr.recent(), s.policy.Window, s.policy)))
		}
		s.log.Warn("engine exited; restarting", "engine", name, "role", e.role, "pid", p.PID(), "exit", exit,
			"restart", tr.total, "recent_restarts", tr.recent(), "limit", s.policy.Limit, "window", s.policy.Window, "backoff", wait)
		if s.changed != nil {
			s.changed(ctx, "")
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		np, err := Start(e.spec)
		if err != nil {
			return fmt.Errorf("restarting %s: %w", name, err)
		}
		e.set(np)
		s.restarts.WithLabelValues(name).Inc()
		s.log.Info("engine restarted", "engine", name, "role", e.role, "pid", np.PID(), "restart", tr.total, "url", e.spec.URL)
		err = WaitHealthy(ctx, []*Process{np}, s.startupTimeout)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotHealthy):
			s.log.Warn("restarted engine not healthy in time; stopping it", "engine", name, "pid", np.PID(), "startup_timeout", s.startupTimeout)
			Stop([]*Process{np}, s.stopTimeout)
		case err != nil:
			// It exited during startup: the next turn counts it.
		default:
			s.log.Info("engine healthy again", "engine", name, "pid", np.PID(), "restart", tr.total)
			if s.changed != nil {
				s.changed(ctx, e.spec.URL)
			}
		}
	}
}
