package launch

import (
	"fmt"
	"time"
)

// The restart defaults, in the spirit of systemd's StartLimitBurst (5
// starts within StartLimitIntervalSec) and Kubernetes' CrashLoopBackOff (a
// doubling wait, capped): an engine that exits at once is restarted after
// 1, 2, 4, 8 and 16 s, and its sixth exit within ten minutes stops
// everything, about half a minute plus five startups after the first; an
// engine that crashes once an hour is restarted every time after 1 s.
const (
	DefaultRestartLimit      = 5
	DefaultRestartWindow     = 10 * time.Minute
	DefaultRestartBackoff    = time.Second
	DefaultRestartMaxBackoff = 30 * time.Second
)

// RestartPolicy says when an engine that exited on its own while serving
// is started again. Zero fields take the defaults above.
type RestartPolicy struct {
	// Limit is the most restarts of one engine within Window: the exit
	// after that gives up and stops everything. Negative: never restart,
	// the first exit stops everything.
	Limit int
	// Window is the sliding window Limit counts restarts in.
	Window time.Duration
	// Backoff is the wait before a restart when the engine has not been
	// restarted within Window; it doubles with each restart within Window,
	// up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
}

func (p *RestartPolicy) setDefaults() {
	if p.Limit == 0 {
		p.Limit = DefaultRestartLimit
	}
	if p.Window <= 0 {
		p.Window = DefaultRestartWindow
	}
	if p.Backoff <= 0 {
		p.Backoff = DefaultRestartBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultRestartMaxBackoff
	}
	p.MaxBackoff = max(p.MaxBackoff, p.Backoff)
}

// String describes the policy for logs and errors, with the flags that set it.
func (p RestartPolicy) String() string {
	if p.Limit < 0 {
		return "restarts off (--restart-limit 0)"
	}
	return fmt.Sprintf("at most %d restarts within %v (--restart-limit, --restart-window)", p.Limit, p.Window)
}

// restartTracker applies a RestartPolicy to one engine's exits. It is not
// safe for concurrent use: one engine's supervisor owns it.
type restartTracker struct {
	policy   RestartPolicy
	restarts []time.Time // the restarts within the window, oldest first
	total    int         // every restart since up started
}

// exited records an exit at now. It returns the wait before the restart
// and ok, or ok false when the policy allows no more restarts.
func (t *restartTracker) exited(now time.Time) (wait time.Duration, ok bool) {
	if t.policy.Limit < 0 {
		return 0, false
	}
	cut := now.Add(-t.policy.Window)
	i := 0
	for i < len(t.restarts) && !t.restarts[i].After(cut) {
		i++
	}
	t.restarts = t.restarts[i:]
	n := len(t.restarts)
	if n >= t.policy.Limit {
		return 0, false
	}
	wait = min(t.policy.Backoff, t.policy.MaxBackoff)
	for range n {
		if wait >= t.policy.MaxBackoff/2 {
			wait = t.policy.MaxBackoff
			break
		}
		wait *= 2
	}
	t.restarts = append(t.restarts, now)
	t.total++
	return wait, true
}

// recent is the number of restarts within the window at the last exit.
func (t *restartTracker) recent() int { return len(t.restarts) }
