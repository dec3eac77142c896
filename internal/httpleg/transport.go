package httpleg

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// Defaults of the Transport's zero fields.
const (
	DefaultConnectTimeout         = 30 * time.Second
	DefaultMaxIdleConnsPerHost    = 256
	DefaultIdleConnTimeout        = 90 * time.Second
	DefaultMaxResponseHeaderBytes = 1 << 20
	// tcpKeepAlive is the period of TCP keep-alive probes on dialed
	// connections, as net/http's default transport sets it.
	tcpKeepAlive = 30 * time.Second
	// probeAfter is how long a connection must have been idle before it is
	// probed for a close by the server on being taken from the pool: 0,
	// every reuse pays the one non-blocking peek (about a microsecond), so
	// that a server's close of an idle connection is seen before a request
	// that cannot be safely re-sent is written on it (see RoundTrip).
	probeAfter  = 0
	bufferBytes = 4 << 10 // the read buffer per connection, as net/http's
)

// ErrResponseHeaderTooLarge is returned (wrapped) by RoundTrip when an
// answer's status line and headers exceed Transport.MaxResponseHeaderBytes.
var ErrResponseHeaderTooLarge = errors.New("httpleg: response headers too large")

// Transport is an http.RoundTripper for plain HTTP/1.1 backends; see the
// package doc. Its zero value is ready to use, with the defaults above and
// no fallback. A Transport must not be copied after first use.
type Transport struct {
	// Fallback serves the requests Transport does not handle itself: other
	// schemes than http (https, ...), bodies of unknown length, CONNECT,
	// trailers, user info in the URL. Nil: such requests fail.
	Fallback http.RoundTripper
	// DialContext, when set, opens connections instead of a net.Dialer with
	// ConnectTimeout and TCP keep-alive every 30s.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// ConnectTimeout bounds dialing a backend (DefaultConnectTimeout when
	// zero); the request's context bounds it as well.
	ConnectTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per
	// host:port (DefaultMaxIdleConnsPerHost when zero); a connection
	// released when its host has that many is closed.
	MaxIdleConnsPerHost int
	// IdleConnTimeout is how long a connection stays idle in the pool
	// before it is closed (DefaultIdleConnTimeout when zero).
	IdleConnTimeout time.Duration
	// MaxResponseHeaderBytes bounds an answer's status line and headers,
	// 1xx answers included (DefaultMaxResponseHeaderBytes when zero):
	// http.ReadResponse alone would allocate whatever a server sends.
	MaxResponseHeaderBytes int64

	// probeAfter overrides the package's probeAfter in tests.
	probeAfter time.Duration

	mu    sync.Mutex
	idle  map[string][]*conn // by host:port, oldest first; taken from the end
	sweep *time.Timer        // closes expired idle connections; nil when none are idle
}

// RoundTrip sends req and returns its answer's headers; the body is read
// from the connection as the caller reads it. The connection goes back to
// the pool when the body was read to its end and the answer allows
// keep-alive; a Close before that, or any error, closes it. Errors caused
// by req's context are the context's (errors.Is matches both its Err and
// its cause). A failure on a reused connection before any byte of the
// answer arrived is retried once on a new connection, with req.GetBody,
// when the server cannot have acted on the request: writing it failed, or
// the method is idempotent. A POST that was written whole and then met a
// closed connection is not re-sent (the engine may have read it: a
// prefill would keep a second lease, a decode pull the KV again); its
// error goes to the caller, as net/http's does.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !handled(req) {
		if t.Fallback == nil {
			closeBody(req.Body)
			return nil, fmt.Errorf("httpleg: %s request to %s is not handled and there is no fallback transport", req.Method, redacted(req.URL))
		}
		return t.Fallback.RoundTrip(req)
	}
	if err := validRequest(req); err != nil {
		closeBody(req.Body)
		return nil, err
	}
	ctx := req.Context()
	addr := hostPort(req.URL)
	body := req.Body
	if body == http.NoBody {
		body = nil
	}
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			closeBody(body)
			return nil, contextErr(ctx)
		}
		c, err := t.getConn(ctx, addr, attempt > 0)
		if err != nil {
			closeBody(body)
			if ctx.Err() != nil {
				return nil, contextErr(ctx)
			}
			return nil, err
		}
		resp, retry, err := t.exchange(ctx, c, req, body)
		closeBody(body)
		if err == nil {
			return resp, nil
		}
		if !retry || attempt > 0 || ctx.Err() != nil {
			return nil, err
		}
		if body != nil {
			if req.GetBody == nil {
				return nil, err
			}
			again, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			body = again
		}
		// The server closed a connection that had been idle: it closed
		// those idle longer as well, or restarted.
		t.dropIdleSince(c.key, c.idleAt)
	}
}

// CloseIdleConnections closes the connections idle in the pool, and the
// fallback's if it has such a method. Connections in use are not affected.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	for _, cs := range idle {
		closeAll(cs)
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// handled reports whether RoundTrip serves req itself: plain HTTP/1.1 with
// a body of known length, nothing net/http would have to add or negotiate.
func handled(req *http.Request) bool {
	u := req.URL
	if u == nil || u.Scheme != "http" || u.Host == "" || u.User != nil ||
		req.Method == http.MethodConnect || len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 {
		return false
	}
	if req.Body == nil || req.Body == http.NoBody {
		return req.ContentLength == 0
	}
	return req.ContentLength > 0
}

// hostPort is the pool key and dial address of u.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// redacted is u for an error message, without a password.
func redacted(u *url.URL) string {
	if u == nil {
		return "(no URL)"
	}
	return u.Redacted()
}

func closeBody(b io.ReadCloser) {
	if b != nil {
		_ = b.Close()
	}
}

// contextErr is the error of an exchange cut by ctx.
func contextErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return &causeError{err: err, cause: cause}
	}
	return err
}

// causeError is a context's error with the cause given to its cancel
// function: it reads as the cause, as net/http words it, and matches both
// (the proxy tells its idle watchdog from a client gone by the cause).
type causeError struct{ err, cause error }

func (e *causeError) Error() string   { return e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.cause, e.err} }

// Timeout reports whether the context's deadline passed, for callers that
// test net.Error.
func (e *causeError) Timeout() bool { return errors.Is(e.err, context.DeadlineExceeded) }

func (t *Transport) maxIdle() int {
	if t.MaxIdleConnsPerHost > 0 {
		return t.MaxIdleConnsPerHost
	}
	return DefaultMaxIdleConnsPerHost
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleConnTimeout > 0 {
		return t.IdleConnTimeout
	}
	return DefaultIdleConnTimeout
}

func (t *Transport) maxHeaderBytes() int64 {
	if t.MaxResponseHeaderBytes > 0 {
		return t.MaxResponseHeaderBytes
	}
	return DefaultMaxResponseHeaderBytes
}

// getConn returns an idle connection to addr that still looks open, or a
// new one (always a new one when fresh).
func (t *Transport) getConn(ctx context.Context, addr string, fresh bool) (*conn, error) {
	for !fresh {
		c, idleFor := t.takeIdle(addr)
		if c == nil {
			break
		}
		probe := t.probeAfter
		if probe == 0 {
			probe = probeAfter
		}
		if idleFor < probe || !peerClosed(c.nc) {
			return c, nil
		}
		c.close()
		t.dropIdleSince(addr, c.idleAt)
	}
	return t.dial(ctx, addr)
}

func (t *Transport) dial(ctx context.Context, addr string) (*conn, error) {
	var nc net.Conn
	var err error
	if t.DialContext != nil {
		nc, err = t.DialContext(ctx, "tcp", addr)
	} else {
		timeout := t.ConnectTimeout
		if timeout <= 0 {
			timeout = DefaultConnectTimeout
		}
		d := net.Dialer{Timeout: timeout, KeepAlive: tcpKeepAlive}
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	c := &conn{key: addr, nc: nc}
	c.br = bufio.NewReaderSize(c, bufferBytes)
	return c, nil
}

// takeIdle pops addr's most recently idled connection and says how long it
// was idle; nil when there is none still within the idle timeout. Those
// past it are closed (all of them at once: the pool is ordered by age).
func (t *Transport) takeIdle(addr string) (*conn, time.Duration) {
	now := time.Now()
	t.mu.Lock()
	cs := t.idle[addr]
	if len(cs) == 0 {
		t.mu.Unlock()
		return nil, 0
	}
	c := cs[len(cs)-1]
	idleFor := now.Sub(c.idleAt)
	if idleFor > t.idleTimeout() {
		delete(t.idle, addr)
		t.mu.Unlock()
		closeAll(cs)
		return nil, 0
	}
	cs[len(cs)-1] = nil
	t.idle[addr] = cs[:len(cs)-1]
	t.mu.Unlock()
	return c, idleFor
}

// putIdle returns c to the pool, or closes it when its host has
// MaxIdleConnsPerHost idle already.
func (t *Transport) putIdle(c *conn) {
	c.reused = true
	c.idleAt = time.Now()
	t.mu.Lock()
	cs := t.idle[c.key]
	if len(cs) >= t.maxIdle() {
		t.mu.Unlock()
		c.close()
		return
	}
	if t.idle == nil {
		t.idle = make(map[string][]*conn)
	}
	t.idle[c.key] = append(cs, c)
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.idleTimeout(), t.sweepIdle)
	}
	t.mu.Unlock()
}

// sweepIdle closes the connections idle past the timeout, so that those of
// a host no longer used (a backend removed) do not stay open, and runs
// again when the oldest remaining one expires.
func (t *Transport) sweepIdle() {
	now := time.Now()
	timeout := t.idleTimeout()
	var expired []*conn
	t.mu.Lock()
	next := time.Duration(-1)
	for addr, cs := range t.idle {
		i := 0
		for i < len(cs) && now.Sub(cs[i].idleAt) > timeout {
			i++
		}
		expired = append(expired, cs[:i]...)
		if i == len(cs) {
			delete(t.idle, addr)
			continue
		}
		t.idle[addr] = append(cs[:0], cs[i:]...)
		clear(cs[len(cs)-i:])
		if left := timeout - now.Sub(t.idle[addr][0].idleAt); next < 0 || left < next {
			next = left
		}
	}
	switch {
	case t.sweep == nil:
		// CloseIdleConnections ran meanwhile.
	case next < 0:
		t.sweep = nil
	default:
		t.sweep.Reset(next + time.Millisecond)
	}
	t.mu.Unlock()
	closeAll(expired)
}

// dropIdleSince closes addr's idle connections that have been idle since
// before (or at) since: a server that closed one such connection has closed
// them too, or went away.
func (t *Transport) dropIdleSince(addr string, since time.Time) {
	t.mu.Lock()
	cs := t.idle[addr]
	i := 0
	for i < len(cs) && !cs[i].idleAt.After(since) {
		i++
	}
	dropped := append([]*conn(nil), cs[:i]...)
	if i == len(cs) {
		delete(t.idle, addr)
	} else if i > 0 {
		t.idle[addr] = append(cs[:0], cs[i:]...)
		clear(cs[len(cs)-i:])
	}
	t.mu.Unlock()
	closeAll(dropped)
}

// idleCount is how many connections to addr are idle, for tests.
func (t *Transport) idleCount(addr string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.idle[addr])
}

func closeAll(cs []*conn) {
	for _, c := range cs {
		c.close()
	}
}

// idempotent reports whether req may be sent twice (RFC 9110 §9.2.2, and
// net/http's Idempotency-Key convention).
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// deadConn reports whether err says the server closed or reset the
// connection: on a reused connection before any answer, the request can be
// sent again.
func deadConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}
