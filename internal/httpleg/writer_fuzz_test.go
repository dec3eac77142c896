package httpleg

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// captureConn is a net.Conn that keeps what is written to it.
type captureConn struct {
	net.Conn
	out bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// legRequest is what one fuzz input asks for: a request built as the
// proxy's legs are (an http URL with a host, a body of known length).
type legRequest struct {
	method, path, query string
	headers             [][2]string // name (not canonicalised), value
	body                []byte
	close               bool
	plainReader         bool // a body that is not a *bytes.Reader
}

func (l legRequest) build() *http.Request {
	req := &http.Request{
		Method: l.method,
		URL:    &url.URL{Scheme: "http", Host: "engine:8000", Path: l.path, RawQuery: l.query},
		Header: http.Header{},
		Host:   "engine:8000",
		Close:  l.close,
	}
	for _, h := range l.headers {
		req.Header[h[0]] = append(req.Header[h[0]], h[1])
	}
	if len(l.body) > 0 {
		var r io.Reader = bytes.NewReader(l.body)
		if l.plainReader {
			r = struct{ io.Reader }{r}
		}
		req.Body, req.ContentLength = io.NopCloser(r), int64(len(l.body))
		if !l.plainReader {
			req.Body = readCloser{r}
		}
	}
	return req
}

// readCloser is a body whose *bytes.Reader writeHTTPLeg hands to
// writeRequest, whose one-writev path takes such a reader.
type readCloser struct{ io.Reader }

func (readCloser) Close() error { return nil }

// writeHTTPLeg writes req as RoundTrip does (validRequest, then
// writeRequest), or returns validRequest's refusal.
func writeHTTPLeg(req *http.Request) ([]byte, error) {
	if err := validRequest(req); err != nil {
		return nil, err
	}
	c := &captureConn{}
	lc := &conn{nc: c}
	var body io.Reader
	if req.Body != nil {
		body = req.Body
		if rc, ok := req.Body.(readCloser); ok {
			body = rc.Reader
		}
	}
	if err := lc.writeRequest(req, body); err != nil {
		return nil, err
	}
	return c.out.Bytes(), nil
}

// parsed is what a server reads from a request's bytes.
type parsed struct {
	Method, RequestURI, Host string
	Close                    bool
	ContentLength            int64
	Header                   http.Header // without Content-Length and Connection
	Connection               []string    // Connection's tokens, sorted
	Body                     string
}

// parse reads one request from b as a net/http server would, and reports
// whether bytes follow it (a second, smuggled request).
func parse(b []byte) (parsed, bool, error) {
	br := bufio.NewReader(bytes.NewReader(b))
	r, err := http.ReadRequest(br)
	if err != nil {
		return parsed{}, false, err
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return parsed{}, false, err
	}
	p := parsed{Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Close: r.Close,
		ContentLength: r.ContentLength, Header: r.Header.Clone(), Body: string(body)}
	for _, v := range p.Header["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.ToLower(textproto.TrimString(f)); f != "" && !slices.Contains(p.Connection, f) {
				p.Connection = append(p.Connection, f)
			}
		}
	}
	slices.Sort(p.Connection)
	delete(p.Header, "Content-Length")
	delete(p.Header, "Connection")
	_, perr := br.Peek(1)
	return p, perr == nil, nil
}

// FuzzRequestWriterMatchesNetHTTP holds httpleg's request writer to
// net/http's Request.Write: a server (http.ReadRequest) must read the same
// request from both. Where httpleg refuses a request (a CR, LF or other
// control byte that would split it, a name that is not a token), net/http
// must refuse it too, or sanitize it (it drops invalid header names and
// turns CR and LF in values into spaces), or write something no server
// reads: never a request a server reads with a header or a second request
// that the caller did not ask for.
//
// Differences accepted, both meaning the same to a server:
//   - Content-Length: 0 on a body-less request whose method is not GET,
//     HEAD, POST, PUT or PATCH (httpleg sends it, net/http does not; both
//     read as no body);
//   - Connection: close sent again when a Connection header already holds
//     close in a value after its first (net/http looks at the first value
//     only), so Connection is compared as a set of tokens.
func FuzzRequestWriterMatchesNetHTTP(f *testing.F) {
	type seed struct {
		method, path, query, k1, v1, k2, v2 string
		body                                []byte
		close, plain, big                   bool
	}
	for _, s := range []seed{
		{"POST", "/v1/completions", "", "Content-Type", "application/json", "X-Request-Id", "abc", []byte(`{"prompt":"x"}`), false, false, false},
		{"GET", "/health", "", "Accept", "*/*", "", "", nil, false, false, false},
		{"", "/v1/models", "a=1&b=%20", "User-Agent", "  tandem/1 ", "Connection", "keep-alive, close", nil, true, false, false},
		{"DELETE", "/x y/ü", "q", "user-agent", "", "X-Empty", "", nil, false, false, false},
		{"PUT", "/kv", "", "Idempotency-Key", "k", "Connection", "Upgrade", []byte("0123456789"), true, true, true},
		{"POST", "/", "x\r\nInjected: 1", "X-A", "b", "", "", []byte("{}"), false, false, false},
		{"POST", "/", "", "X-A", "b\r\nInjected: 1", "Bad Name", "v", []byte("{}"), false, false, false},
		{"GET\r\n", "/", "", "X-A\n", "b", "X-B", "c\x00d", nil, false, false, false},
		{"PATCH", "//double", "", "Host", "evil", "Content-Length", "99", []byte("body"), false, true, false},
		{"OPTIONS", "", "", "Transfer-Encoding", "chunked", "Trailer", "X", nil, false, false, false},
	} {
		f.Add(s.method, s.path, s.query, s.k1, s.v1, s.k2, s.v2, s.body, s.close, s.plain, s.big)
	}
	f.Fuzz(func(t *testing.T, method, path, query, k1, v1, k2, v2 string, body []byte, close, plain, big bool) {
		l := legRequest{method: method, path: path, query: query, body: body, close: close, plainReader: plain}
		if big && len(body) > 0 {
			// Past inlineBodyBytes: the writev (or copy) path.
			l.body = bytes.Repeat(body, 1+(inlineBodyBytes+1)/len(body))
		}
		for _, h := range [][2]string{{k1, v1}, {k2, v2}} {
			if h[0] != "" {
				l.headers = append(l.headers, h)
			}
		}
		req := l.build()
		if !handled(req) {
			return // RoundTrip hands it to the fallback transport
		}
		legBytes, legErr := writeHTTPLeg(req)

		var std bytes.Buffer
		stdErr := l.build().Write(&std)

		if legErr != nil {
			if stdErr != nil {
				return
			}
			p, more, err := parse(std.Bytes())
			if err != nil {
				return // no server reads what net/http wrote either
			}
			if more {
				t.Fatalf("httpleg refused (%v); net/http wrote a request followed by more bytes:\n%q", legErr, std.Bytes())
			}
			asked := map[string]bool{"Host": true, "User-Agent": true}
			for _, h := range l.headers {
				asked[textproto.CanonicalMIMEHeaderKey(h[0])] = true
			}
			for k := range p.Header {
				if !asked[k] {
					t.Fatalf("httpleg refused (%v); net/http wrote header %q that was not asked for:\n%q", legErr, k, std.Bytes())
				}
			}
			return
		}
		if stdErr != nil {
			t.Fatalf("httpleg wrote %q; net/http refuses: %v", legBytes, stdErr)
		}
		got, gotMore, gotErr := parse(legBytes)
		want, wantMore, wantErr := parse(std.Bytes())
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("a server reads httpleg's bytes with error %v and net/http's with %v\nhttpleg:  %q\nnet/http: %q", gotErr, wantErr, legBytes, std.Bytes())
		}
		if gotMore || wantMore {
			t.Fatalf("bytes after the request (httpleg %v, net/http %v)\nhttpleg:  %q\nnet/http: %q", gotMore, wantMore, legBytes, std.Bytes())
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("a server reads different requests (-net/http +httpleg):\n%s\nhttpleg:  %q\nnet/http: %q", diff, legBytes, std.Bytes())
		}
	})
}
