package soak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"

	"github.com/tandem-serve/tandem/internal/bench"
)

// Outcome kinds that are not failures.
const (
	KindRemote   = "ok: remote (prefill → decode)"
	KindFallback = "ok: fallback"
	KindOK       = "ok: no x-tandem-pd"
	// KindHung is a request cancelled at the hard per-request deadline.
	KindHung = "hung: hard deadline reached (client timeout)"
)

var httpStatus = regexp.MustCompile(`^HTTP (\d{3})\b`)

// Classify names the outcome of one request: its P/D path when it
// succeeded (the x-tandem-pd value, with a fallback's reason), else the
// kind of its error — an HTTP status, a refused or reset connection, a
// stream cut short, an error inside the stream, or the deadline.
func Classify(o bench.Outcome) string {
	if o.Err == nil {
		path, params, _ := strings.Cut(o.PD, ";")
		switch strings.TrimSpace(path) {
		case "remote":
			return KindRemote
		case "":
			return KindOK
		case "fallback":
			if _, reason, ok := strings.Cut(params, "reason="); ok {
				reason, _, _ = strings.Cut(reason, ";")
				return KindFallback + " (reason=" + strings.TrimSpace(reason) + ")"
			}
			return KindFallback
		default:
			return "ok: " + strings.TrimSpace(path)
		}
	}
	err := o.Err
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return KindHung
	case httpStatus.MatchString(msg):
		return "error: HTTP " + httpStatus.FindStringSubmatch(msg)[1]
	case errors.Is(err, syscall.ECONNREFUSED):
		return "error: connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "error: connection reset"
	case strings.Contains(msg, "stream ended before [DONE]"):
		return "error: stream cut before [DONE]"
	case strings.HasPrefix(msg, "server error in stream"):
		return "error: error event in stream"
	case strings.Contains(msg, "stream carried no tokens"):
		return "error: empty stream"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "error: client timeout (connect/transport)"
	}
	return "error: other (" + trim(msg, 60) + ")"
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// IsFailure reports whether a kind from Classify is an error.
func IsFailure(kind string) bool { return !strings.HasPrefix(kind, "ok") }

// Tally counts requests by kind.
type Tally map[string]int

// Total is the number of requests counted.
func (t Tally) Total() int {
	n := 0
	for _, c := range t {
		n += c
	}
	return n
}

// Failed is the number of requests that did not succeed.
func (t Tally) Failed() int {
	n := 0
	for k, c := range t {
		if IsFailure(k) {
			n += c
		}
	}
	return n
}

// String prints the counts by outcome, in key order.
func (t Tally) String() string { return fmt.Sprint(map[string]int(t)) }
