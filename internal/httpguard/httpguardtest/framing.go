// Package httpguardtest checks, over raw TCP against a real listener, that a
// server closes the connection after a request whose framing is ambiguous
// (package httpguard), for the tests of every server that uses it.
package httpguardtest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// smuggled is the request hidden after the first one's body. Any answer to
// it shows that the server read it as a request of its own.
const smuggled = "GET /smuggled HTTP/1.1\r\nHost: smuggled\r\n\r\n"

// ioDeadline bounds each exchange; a server that keeps the connection open
// fails the check when it passes.
const ioDeadline = 10 * time.Second

// FramingCase is a first request, on a fresh connection, that a server must
// answer and then close the connection after.
type FramingCase struct {
	Name string
	// Raw builds the request's bytes for path; the smuggled request follows
	// them on the connection.
	Raw func(path string) string
}

// chunkedEnd is an empty chunked body: the end of the first request for a
// server that reads Transfer-Encoding, the start of its body for one that
// reads Content-Length.
const chunkedEnd = "0\r\n\r\n"

// FramingCases are the requests RFC 9112 says to close the connection
// after: Content-Length beside Transfer-Encoding (§6.1), the same with the
// Transfer-Encoding obs-folded (§5.2), and HTTP/1.0 with Transfer-Encoding
// (§6.1). Each Content-Length covers the chunked end and the smuggled
// request, as a front end trusting Content-Length would forward them.
var FramingCases = []FramingCase{
	{"Content-Length beside Transfer-Encoding", func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunkedEnd+smuggled)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd
	}},
	{"Transfer-Encoding obs-folded beside Content-Length", func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunkedEnd+smuggled)) + "\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" + chunkedEnd
	}},
	{"Transfer-Encoding alone", func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd
	}},
	{"HTTP/1.0 keep-alive with Transfer-Encoding", func(path string) string {
		return "POST " + path + " HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunkedEnd)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd
	}},
}

// CheckFraming runs each of FramingCases against the server at addr (a
// POST to path, a route that takes a JSON body), with a second request
// right behind it on the same connection, and fails t unless the server
// answers the first with "Connection: close", never answers the second, and
// closes the connection. A control checks that two plain pipelined requests
// are both answered on one connection, so that a server that answers nothing
// after the first for some other reason does not pass.
func CheckFraming(t *testing.T, addr, path string) {
	t.Helper()
	for _, c := range FramingCases {
		t.Run(c.Name+": the connection closes and the request behind it is never served", func(t *testing.T) {
			resps, closed, err := exchange(addr, c.Raw(path)+smuggled, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(resps) != 1 {
				t.Fatalf("%d answers on the connection, want 1 (the request behind the first was served: %v)", len(resps), statuses(resps))
			}
			if !resps[0].Close { // ReadResponse moves "Connection: close" here
				t.Errorf("the answer does not say Connection: close")
			}
			if !closed {
				t.Errorf("the connection stayed open after the answer")
			}
		})
	}
	t.Run("control: plain pipelined requests are both served on one connection", func(t *testing.T) {
		first := "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
		resps, _, err := exchange(addr, first+smuggled, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(resps) != 2 {
			t.Fatalf("%d answers, want 2", len(resps))
		}
		if resps[0].Close {
			t.Errorf("a plain request's answer says Connection: close")
		}
	})
}

// exchange writes raw on a fresh connection to addr and reads answers until
// it has want of them, the server closes the connection (closed), or the
// deadline passes (the connection stayed open).
func exchange(addr, raw string, want int) (resps []*http.Response, closed bool, err error) {
	c, err := net.DialTimeout("tcp", addr, ioDeadline)
	if err != nil {
		return nil, false, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(ioDeadline)); err != nil {
		return nil, false, err
	}
	if _, err := io.WriteString(c, raw); err != nil {
		return nil, false, err
	}
	br := bufio.NewReader(c)
	for len(resps) < want {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return resps, false, nil
			}
			// EOF, or a reset: the server closed the connection.
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
				return resps, true, nil
			}
			return resps, false, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resps = append(resps, resp)
		if err != nil {
			return resps, false, err
		}
	}
	return resps, false, nil
}

func statuses(resps []*http.Response) []string {
	var s []string
	for _, r := range resps {
		s = append(s, r.Status)
	}
	return s
}
