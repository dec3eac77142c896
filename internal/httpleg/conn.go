package httpleg

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// earlyAnswerWait bounds reading an answer after writing the request failed:
// a server may answer (413, 401) and close before reading the whole body,
// and that answer, not the broken write, is the result, as with net/http.
const earlyAnswerWait = time.Second

// inlineBodyBytes is the largest body copied after the request's head to
// leave in one write; a larger one is sent with it by writev. At most
// maxKeptHeadBytes of buffer are kept on a connection between requests.
const (
	inlineBodyBytes  = 4 << 10
	maxKeptHeadBytes = 16 << 10
)

// defaultUserAgent is net/http's, sent when a request sets none.
const defaultUserAgent = "Go-http-client/1.1"

// aLongTimeAgo is a deadline in the past: setting it makes the connection's
// blocked reads and writes return at once.
var aLongTimeAgo = time.Unix(1, 0)

// errBodyClosed is a read after Close, worded as net/http's.
var errBodyClosed = errors.New("http: read on closed response body")

// conn is one keep-alive connection. Its fields are used by one exchange at
// a time (the caller's goroutine), or by nobody while it is idle.
type conn struct {
	key    string // host:port
	nc     net.Conn
	br     *bufio.Reader // reads through the conn itself, for nread and limit
	wbuf   []byte        // the request head being written, kept between requests
	idleAt time.Time     // when it last went into the pool
	reused bool          // it served an exchange before the current one
	nread  int64         // bytes read from nc in the current exchange
	limit  int64         // while > 0, reads stop there (the header bound)
}

// Read reads from the network, counting, and within limit while it is set.
func (c *conn) Read(p []byte) (int, error) {
	if c.limit > 0 {
		left := c.limit - c.nread
		if left <= 0 {
			return 0, ErrResponseHeaderTooLarge
		}
		if int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := c.nc.Read(p)
	c.nread += int64(n)
	return n, err
}

// interrupt makes the connection's pending and future I/O fail; it is how
// a context's end reaches a blocked read or write.
func (c *conn) interrupt() { _ = c.nc.SetDeadline(aLongTimeAgo) }

func (c *conn) close() { _ = c.nc.Close() }

// exchange writes req, with reqBody (its bytes still to send), on c and reads
// the answer's headers. On success c belongs to the answer's body, or is
// back in the pool when the answer has none. On error c is closed and retry
// says whether req may be sent again on a new connection: c was reused, the
// server closed it, no byte of an answer arrived, and the server cannot
// have acted on req (its write failed, or it is idempotent).
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request, reqBody io.Reader) (resp *http.Response, retry bool, err error) {
	stop := context.AfterFunc(ctx, c.interrupt)
	c.nread = 0
	var werr error
	fail := func(err error) (*http.Response, bool, error) {
		stop()
		c.close()
		if ctx.Err() != nil {
			return nil, false, contextErr(ctx)
		}
		_, ofBody := errors.AsType[*bodyError](err)
		safe := werr != nil || idempotent(req)
		return nil, safe && !ofBody && c.reused && c.nread == 0 && deadConn(err), err
	}
	werr = c.writeRequest(req, reqBody)
	if werr != nil {
		if _, ok := errors.AsType[*bodyError](werr); ok || ctx.Err() != nil {
			return fail(werr)
		}
		// Bounded: were the context's interrupt to run between the check
		// above and this deadline, it would be undone for that long.
		_ = c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	}
	resp, err = t.readResponse(c, req)
	if werr != nil {
		// Cleared before ctx is looked at below: an interrupt that came
		// first is then seen there.
		_ = c.nc.SetReadDeadline(time.Time{})
		if err != nil {
			err = werr
		}
	}
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	reuse := werr == nil && resp.ProtoAtLeast(1, 1) && !resp.Close && !req.Close && !hasToken(req.Header["Connection"], "close")
	if resp.Body == http.NoBody {
		t.release(c, stop, reuse && c.br.Buffered() == 0)
		return resp, false, nil
	}
	resp.Body = &body{t: t, c: c, src: resp.Body, ctx: ctx, stop: stop, reuse: reuse}
	return resp, false, nil
}

// release ends c's exchange: back to the pool when reuse, closed otherwise
// or when the context's interrupt has already run (or is running).
func (t *Transport) release(c *conn, stop func() bool, reuse bool) {
	if !stop() || !reuse {
		c.close()
		return
	}
	t.putIdle(c)
}

// readResponse reads the final answer's status line and headers (skipping
// 1xx answers) within MaxResponseHeaderBytes.
func (t *Transport) readResponse(c *conn, req *http.Request) (*http.Response, error) {
	limit := t.maxHeaderBytes()
	c.limit = limit
	defer func() { c.limit = 0 }()
	for {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			if c.nread >= limit {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrResponseHeaderTooLarge, limit)
			}
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, fmt.Errorf("httpleg: unexpected answer %s", resp.Status)
		case resp.StatusCode >= 200:
			return resp, nil
		}
		// 100 Continue, 103 Early Hints: ReadResponse gave them no body;
		// the final answer follows.
	}
}

// writeRequest writes req's head and body in one system call where it can:
// a body of up to inlineBodyBytes is copied after the head, a larger
// bytes.Reader (the proxy's legs: the whole prompt) is sent with the head by
// one writev without a copy. A bufio.Writer of net/http's 4 KiB would cost a
// write per 4 KiB of prompt instead.
func (c *conn) writeRequest(req *http.Request, body io.Reader) error {
	b := c.appendHead(c.wbuf[:0], req)
	defer func() {
		if cap(b) <= maxKeptHeadBytes {
			c.wbuf = b[:0]
		}
	}()
	n := req.ContentLength
	if body == nil || n <= 0 {
		_, err := c.nc.Write(b)
		return err
	}
	if n <= inlineBodyBytes {
		b = slices.Grow(b, int(n))
		got, err := io.ReadFull(body, b[len(b):len(b)+int(n)])
		if err != nil {
			return bodyErr(err, n, int64(got))
		}
		_, err = c.nc.Write(b[:len(b)+int(n)])
		return err
	}
	if br, ok := body.(*bytes.Reader); ok && int64(br.Len()) == n {
		// bytes.Reader hands its slice to Write: no copy.
		_, err := br.WriteTo(&headWriter{nc: c.nc, head: b, left: n})
		return err
	}
	if wt, ok := body.(io.WriterTo); ok {
		// What http.NewRequest makes of a *bytes.Reader body (io.NopCloser
		// keeps its WriteTo): the same one writev, with the length held
		// to ContentLength since the reader's is not known here.
		w := &headWriter{nc: c.nc, head: b, left: n}
		written, err := wt.WriteTo(w)
		switch {
		case w.over:
			return &bodyError{fmt.Errorf("http: ContentLength=%d with a longer Body", n)}
		case err != nil && w.werr == nil:
			return bodyErr(err, n, written)
		case err == nil && written < n:
			return bodyErr(nil, n, written)
		}
		return err // the connection's
	}
	if _, err := c.nc.Write(b); err != nil {
		return err
	}
	src := &errReader{r: body}
	written, err := io.CopyN(c.nc, src, n)
	switch {
	case src.err != nil:
		return bodyErr(src.err, n, written)
	case written < n && err == io.EOF:
		return bodyErr(nil, n, written)
	}
	return err // the connection's
}

// appendHead appends req's request line and headers to b.
func (c *conn) appendHead(b []byte, req *http.Request) []byte {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, req.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, hostOf(req)...)
	b = append(b, "\r\n"...)
	ua := defaultUserAgent
	if vs, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(vs) > 0 {
			ua = textproto.TrimString(vs[0])
		}
	}
	if ua != "" {
		b = append(b, "User-Agent: "...)
		b = append(b, ua...)
		b = append(b, "\r\n"...)
	}
	if req.ContentLength > 0 || method != http.MethodGet && method != http.MethodHead {
		// As net/http: a request of any other method says it has no body.
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, "\r\n"...)
	}
	if req.Close && !hasToken(req.Header["Connection"], "close") {
		b = append(b, "Connection: close\r\n"...)
	}
	for k, vs := range req.Header {
		if excludedHeader(k) {
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, textproto.TrimString(v)...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

// headWriter writes a request's head with the first Write of its body, in
// one writev, and at most left bytes of body: a Write past them writes
// nothing and fails (over), so no more than ContentLength bytes reach the
// wire whatever the body's writer does.
type headWriter struct {
	nc   net.Conn
	head []byte
	left int64
	over bool  // a Write went past left
	werr error // the connection's error, to tell it from the body's
}

// errBodyTooLong is a body longer than its ContentLength.
var errBodyTooLong = errors.New("http: request body longer than its ContentLength")

func (w *headWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > w.left {
		w.over = true
		return 0, errBodyTooLong
	}
	var n int
	var err error
	if w.head == nil {
		n, err = w.nc.Write(p)
	} else {
		head := len(w.head)
		bufs := net.Buffers{w.head, p}
		w.head = nil
		var m int64
		m, err = bufs.WriteTo(w.nc)
		n = max(0, int(m)-head)
	}
	w.left -= int64(n)
	w.werr = err
	return n, err
}

// bodyError is a failure of the request's body itself (a read error, a
// length that is not ContentLength): not the connection's, never retried.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// bodyErr is the error of a body that gave got of its n bytes, then err.
func bodyErr(err error, n, got int64) error {
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return &bodyError{fmt.Errorf("reading the request body: %w", err)}
	}
	return &bodyError{fmt.Errorf("http: ContentLength=%d with Body length %d", n, got)}
}

// errReader remembers its reader's error, to tell it from the writer's.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// hostOf is the Host header of req.
func hostOf(req *http.Request) string {
	if req.Host != "" {
		return req.Host
	}
	return req.URL.Host
}

// excludedHeader reports whether writeRequest writes k (canonical) itself
// or, as net/http, never from Request.Header.
func excludedHeader(k string) bool {
	switch k {
	case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

// validRequest checks what writeRequest writes verbatim, before any byte
// is written: a header injecting CR or LF would split the request.
func validRequest(req *http.Request) error {
	if h := hostOf(req); !validValue(h) || strings.ContainsAny(h, " \t") {
		return fmt.Errorf("httpleg: invalid Host %q", h)
	}
	if !validToken(req.Method) && req.Method != "" {
		return fmt.Errorf("httpleg: invalid method %q", req.Method)
	}
	// The request line's path is escaped (URL.EscapedPath); its raw query
	// and an opaque URL are written as they are.
	if !validURIPart(req.URL.RawQuery) || !validURIPart(req.URL.Opaque) {
		return fmt.Errorf("httpleg: control character in the request URI %q: escape the URL's query", redacted(req.URL))
	}
	for k, vs := range req.Header {
		if !validToken(k) {
			return fmt.Errorf("httpleg: invalid header field name %q", k)
		}
		for _, v := range vs {
			if !validValue(v) {
				return fmt.Errorf("httpleg: invalid header field value for %q", k)
			}
		}
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token, as header names and
// methods must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(b)) {
			return false
		}
	}
	return true
}

// validValue reports whether s holds no control character but tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

// validURIPart reports whether s holds no control character, as net/http
// requires of a request URI.
func validURIPart(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated header values vs contain
// token (case-insensitive).
func hasToken(vs []string, token string) bool {
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// body is an answer's body while its connection is in use: read to its end
// with keep-alive allowed, it returns the connection to the pool; an error
// or a Close before the end closes the connection.
type body struct {
	t     *Transport
	c     *conn
	src   io.ReadCloser // ReadResponse's body over c.br; never closed, as its Close drains the rest
	ctx   context.Context
	stop  func() bool // stops the context's interrupt
	reuse bool        // the answer allows keep-alive
	err   error       // sticky, set by Read only

	closed   atomic.Bool
	released atomic.Bool
}

// Read reads the answer's body as it arrives.
func (b *body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.src.Read(p)
	switch {
	case err == io.EOF:
		b.release(b.reuse && b.c.br.Buffered() == 0)
	case err != nil:
		switch {
		case b.ctx.Err() != nil:
			err = contextErr(b.ctx)
		case b.closed.Load():
			err = errBodyClosed
		}
		b.release(false)
	}
	b.err = err
	return n, err
}

// Close closes the connection unless the body was read to its end; it may
// be called while another goroutine is blocked in Read, which then returns.
func (b *body) Close() error {
	b.closed.Store(true)
	b.release(false)
	return nil
}

func (b *body) release(reuse bool) {
	if b.released.Swap(true) {
		return
	}
	b.t.release(b.c, b.stop, reuse)
}
