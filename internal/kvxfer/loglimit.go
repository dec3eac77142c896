package kvxfer

import (
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/clock"
)

// Limits of logLimiter as the producer uses it.
const (
	// refusalLogInterval is the shortest time between two log lines about
	// refused or failed side-channel connections from one address.
	refusalLogInterval = 10 * time.Second
	// refusalLogAddrs bounds the addresses tracked at once; lines about
	// more addresses than that within one interval share one line per
	// interval.
	refusalLogAddrs = 256
)

// logLimiter bounds the log lines that peers who never authenticated can
// cause (connections refused by --kv-peers, failed handshakes): at most one
// line per source address per interval, and, when more than maxAddrs
// addresses are seen within one interval (a flood from many addresses),
// one line per interval for all the others together. Each line that is
// logged says how many were suppressed before it. It allocates nothing
// per suppressed line, and holds at most maxAddrs entries.
type logLimiter struct {
	interval time.Duration
	maxAddrs int
	clock    clock.Clock

	mu    sync.Mutex
	addrs map[string]*limitEntry
	rest  limitEntry // addresses beyond maxAddrs
}

type limitEntry struct {
	last       time.Time // when the last line was logged
	suppressed int       // lines suppressed since
}

func newLogLimiter(interval time.Duration, maxAddrs int, c clock.Clock) *logLimiter {
	if c == nil {
		c = clock.System{}
	}
	return &logLimiter{interval: interval, maxAddrs: maxAddrs, clock: c, addrs: make(map[string]*limitEntry)}
}

// allow reports whether a line about addr may be logged now, how many lines
// were suppressed since the last one logged for it, and whether addr
// shares its budget with other addresses (the table is full).
func (l *logLimiter) allow(addr string) (ok bool, suppressed int, shared bool) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.addrs[addr]
	if e == nil {
		if len(l.addrs) >= l.maxAddrs {
			l.prune(now)
		}
		if len(l.addrs) >= l.maxAddrs {
			e, shared = &l.rest, true
		} else {
			e = &limitEntry{}
			l.addrs[addr] = e
		}
	}
	if !e.last.IsZero() && now.Sub(e.last) < l.interval {
		e.suppressed++
		return false, 0, shared
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return true, suppressed, shared
}

// prune forgets addresses whose last line is an interval old; what they
// suppressed since is counted with the shared entry's, so no count is lost.
func (l *logLimiter) prune(now time.Time) {
	for a, e := range l.addrs {
		if now.Sub(e.last) >= l.interval {
			l.rest.suppressed += e.suppressed
			delete(l.addrs, a)
		}
	}
}

// warn logs msg with args at warning level on log, unless a line about
// addr was logged within the interval; a line logged carries "suppressed"
// (lines about addr left out since its last one) when there were any.
func (l *logLimiter) warn(log *slog.Logger, addr, msg string, args ...any) {
	ok, n, shared := l.allow(addr)
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	if shared {
		args = append(args, "rate_limit", "too many addresses: this line stands for all addresses past the first "+strconv.Itoa(l.maxAddrs))
	}
	log.Warn(msg, args...)
}
