package httpleg

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// writesConn is a net.Conn that keeps each Write apart.
type writesConn struct {
	net.Conn
	writes [][]byte
}

func (c *writesConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *writesConn) all() []byte { return bytes.Join(c.writes, nil) }

func postWithBody(body io.Reader, n int64) *http.Request {
	return &http.Request{
		Method: http.MethodPost,
		URL:    &url.URL{Scheme: "http", Host: "engine:8000", Path: "/v1/completions"},
		Header: http.Header{"Content-Type": {"application/json"}},
		Host:   "engine:8000", Body: io.NopCloser(body), ContentLength: n,
	}
}

// The proxy builds its legs with http.NewRequest, whose body is a
// *bytes.Reader behind io.NopCloser: that body goes out with the head in one
// vectored write (head, body), not copied 32 KiB at a time.
func TestNopCloserBytesReaderBodyGoesOutWithTheHead(t *testing.T) {
	prompt := bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16)
	req, err := http.NewRequest(http.MethodPost, "http://engine:8000/v1/completions", bytes.NewReader(prompt))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := any(req.Body).(*bytes.Reader); ok {
		t.Fatal("http.NewRequest no longer wraps the reader: this test tests nothing")
	}
	c := &writesConn{}
	if err := (&conn{nc: c}).writeRequest(req, req.Body); err != nil {
		t.Fatal(err)
	}
	if len(c.writes) != 2 || !bytes.Equal(c.writes[1], prompt) {
		sizes := make([]int, len(c.writes))
		for i, w := range c.writes {
			sizes[i] = len(w)
		}
		t.Fatalf("writes of %v bytes; want the head, then the whole %d-byte body in one", sizes, len(prompt))
	}
	if !bytes.HasPrefix(c.writes[0], []byte("POST /v1/completions HTTP/1.1\r\n")) || !bytes.HasSuffix(c.writes[0], []byte("\r\n\r\n")) {
		t.Fatalf("first write is not the head: %q", c.writes[0])
	}
}

// tooLong is a body whose WriteTo writes more than it was said to have.
type tooLong struct{ data []byte }

func (t tooLong) Read([]byte) (int, error) { return 0, errors.New("tooLong: Read not expected") }
func (t tooLong) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for range 3 {
		n, err := w.Write(t.data)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// A body that writes past its ContentLength fails as the body's error, and
// no byte past ContentLength reaches the wire (the next request on the
// connection would read them as its own).
func TestWriterToBodyHeldToContentLength(t *testing.T) {
	const n = 10 << 10
	c := &writesConn{}
	err := (&conn{nc: c}).writeRequest(postWithBody(tooLong{bytes.Repeat([]byte{'x'}, 6<<10)}, n), tooLong{bytes.Repeat([]byte{'x'}, 6<<10)})
	if _, ok := errors.AsType[*bodyError](err); !ok || !strings.Contains(err.Error(), "longer") {
		t.Fatalf("err = %v; want a body error saying the body is longer", err)
	}
	head := bytes.Index(c.all(), []byte("\r\n\r\n")) + 4
	if body := len(c.all()) - head; body > n {
		t.Fatalf("%d body bytes on the wire; at most ContentLength %d", body, n)
	}
}

// A body shorter than its ContentLength is the body's error, as net/http's.
func TestWriterToBodyShorterThanContentLength(t *testing.T) {
	short := bytes.Repeat([]byte{'y'}, 8<<10)
	c := &writesConn{}
	body := io.NopCloser(bytes.NewReader(short))
	err := (&conn{nc: c}).writeRequest(postWithBody(body, 9<<10), body)
	if _, ok := errors.AsType[*bodyError](err); !ok || !strings.Contains(err.Error(), "ContentLength=9216 with Body length 8192") {
		t.Fatalf("err = %v; want net/http's ContentLength mismatch as a body error", err)
	}
}
