package httpleg

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// server is an httptest server that counts the connections it accepted.
type server struct {
	*httptest.Server
	accepted, closed atomic.Int32
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.accepted.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// addr is the pool key of s.
func (s *server) addr() string { return strings.TrimPrefix(s.URL, "http://") }

// rawServer accepts TCP connections on loopback and runs serve on each; it
// returns its URL and the number of connections accepted so far.
func rawServer(t *testing.T, serve func(n int, c net.Conn)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(accepted.Add(1))
			wg.Go(func() {
				defer c.Close()
				serve(n, c)
			})
		}
	})
	return "http://" + ln.Addr().String(), &accepted
}

// readRequest reads one request from br, body included.
func readRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(req.Body)
	return req, body, err
}

func post(t *testing.T, tr http.RoundTripper, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req)
}

// roundTrip sends a POST and reads the whole answer.
func roundTrip(t *testing.T, tr http.RoundTripper, url, body string) (int, string, error) {
	t.Helper()
	resp, err := post(t, tr, t.Context(), url, body)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), err
}

func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Got-Length", r.Header.Get("Content-Length"))
	w.Header().Set("X-Got-Trace", r.Header.Get("X-Trace"))
	w.Header().Set("X-Got-Host", r.Host)
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), body)
}

func TestSequentialRequestsReuseOneConnection(t *testing.T) {
	s := newServer(t, echo)
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for i := range 100 {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+"/v1/completions?x=1", bytes.NewReader([]byte(fmt.Sprintf(`{"n":%d}`, i))))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Trace", "t1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: reading: %v", i, err)
		}
		want := fmt.Sprintf(`POST /v1/completions?x=1 {"n":%d}`, i)
		if string(data) != want || resp.Header.Get("X-Got-Trace") != "t1" || resp.Header.Get("X-Got-Host") != s.addr() ||
			resp.Header.Get("X-Got-Length") != fmt.Sprint(len(want)-len("POST /v1/completions?x=1 ")) {
			t.Fatalf("request %d: %q, headers %v", i, data, resp.Header)
		}
	}
	// A GET without a body, through http.Client as the proxy's health checks go.
	resp, err := (&http.Client{Transport: tr}).Get(s.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(data) != "GET /health " || resp.Header.Get("X-Got-Length") != "" {
		t.Errorf("GET: %q, Content-Length %q", data, resp.Header.Get("X-Got-Length"))
	}
	if n := s.accepted.Load(); n != 1 {
		t.Errorf("101 sequential requests opened %d connections, want 1", n)
	}
	if n := tr.idleCount(s.addr()); n != 1 {
		t.Errorf("%d idle connections, want 1", n)
	}
}

func TestConcurrentRequestsKeepABoundedPool(t *testing.T) {
	const n, maxIdle = 32, 4
	var arrived atomic.Int32
	all := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
		echo(w, r)
	})
	tr := &Transport{MaxIdleConnsPerHost: maxIdle}
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, body, err := roundTrip(t, tr, s.URL+"/", fmt.Sprint(i)); err != nil || body != fmt.Sprintf("POST / %d", i) {
				t.Errorf("request %d: %q, %v", i, body, err)
			}
		})
	}
	wg.Wait()
	if got := s.accepted.Load(); got != n {
		t.Errorf("%d requests held at once opened %d connections, want %d", n, got, n)
	}
	if got := tr.idleCount(s.addr()); got != maxIdle {
		t.Errorf("%d idle connections after the burst, want MaxIdleConnsPerHost = %d", got, maxIdle)
	}
	for i := range 10 {
		if _, _, err := roundTrip(t, tr, s.URL+"/", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.accepted.Load(); got != n {
		t.Errorf("sequential requests after the burst opened %d new connections, want 0", got-n)
	}
}

func TestIdleConnectionClosedByTheServerIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		probe  time.Duration
		method string
		resent bool // the closed connection is met after the write, and the request is sent again
	}{
		{"POST found closed by the probe before use", time.Nanosecond, http.MethodPost, false},
		{"GET found closed by the first read, and re-sent", time.Hour, http.MethodGet, true},
		{"POST found closed by the first read, not re-sent", time.Hour, http.MethodPost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var bodies []string
			closed := make(chan struct{}, 10)
			url, accepted := rawServer(t, func(_ int, c net.Conn) {
				// One answer per connection, then close, as a server whose
				// idle timeout is shorter than the pool's does.
				req, body, err := readRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				if len(body) == 0 {
					body = []byte(req.Header.Get("X-Leg"))
				}
				mu.Lock()
				bodies = append(bodies, string(body))
				mu.Unlock()
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				c.Close()
				closed <- struct{}{}
			})
			tr := &Transport{probeAfter: tc.probe}
			defer tr.CloseIdleConnections()
			var failed int
			for i := range 3 {
				leg := fmt.Sprintf("leg %d", i)
				var req *http.Request
				if tc.method == http.MethodGet {
					req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
					req.Header.Set("X-Leg", leg)
				} else {
					req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(leg))
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					if tc.probe == time.Hour && tc.method == http.MethodPost && i > 0 {
						failed++ // the written POST met the closed connection
						continue
					}
					t.Fatalf("request %d: %v", i, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || string(got) != leg {
					t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, got, err)
				}
				<-closed
				waitIdleSawClose(t, tr)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.probe == time.Hour && tc.method == http.MethodPost:
				// Request 0 answered on a fresh connection; request 1 written on
				// the closed one and not re-sent (an error); the failure dropped
				// the connection, so request 2 dialed again.
				if failed != 1 || accepted.Load() != 2 {
					t.Errorf("%d failures over %d connections, want 1 over 2", failed, accepted.Load())
				}
				if want := []string{"leg 0", "leg 2"}; fmt.Sprint(bodies) != fmt.Sprint(want) {
					t.Errorf("the server got %q, want %q", bodies, want)
				}
			default:
				if n := accepted.Load(); n != 3 {
					t.Errorf("%d connections, want 3", n)
				}
				if want := []string{"leg 0", "leg 1", "leg 2"}; fmt.Sprint(bodies) != fmt.Sprint(want) {
					t.Errorf("the server got %q, want %q (each once, whole)", bodies, want)
				}
			}
		})
	}
}

// waitIdleSawClose waits until every idle connection of tr has received
// its server's close (FIN), so that the next request meets a closed
// connection however late the FIN travelled.
func waitIdleSawClose(t *testing.T, tr *Transport) {
	t.Helper()
	testutil.WaitFor(t, "the server's close to reach the idle connections", 5*time.Second, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, cs := range tr.idle {
			for _, c := range cs {
				if !peerClosed(c.nc) {
					return false
				}
			}
		}
		return true
	})
}

func TestNoRetryOnceTheAnswerStarted(t *testing.T) {
	var requests atomic.Int32
	url, accepted := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			if requests.Add(1) == 1 {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 O") // and dies
			return
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	if _, _, err := roundTrip(t, tr, url, "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := roundTrip(t, tr, url, "b"); err == nil {
		t.Fatal("an answer cut in its status line was not an error")
	}
	if n, c := requests.Load(), accepted.Load(); n != 2 || c != 1 {
		t.Errorf("the server got %d requests on %d connections, want 2 on 1 (no retry)", n, c)
	}
}

func TestServerDyingMidBodyIsAnErrorAndTheConnectionIsNotReused(t *testing.T) {
	for _, tc := range []struct{ name, answer string }{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, accepted := rawServer(t, func(_ int, c net.Conn) {
				if _, _, err := readRequest(bufio.NewReader(c)); err == nil {
					io.WriteString(c, tc.answer)
				}
			})
			tr := &Transport{}
			defer tr.CloseIdleConnections()
			resp, err := post(t, tr, t.Context(), url, "x")
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !errors.Is(err, io.ErrUnexpectedEOF) || string(data) != "0123456789" {
				t.Errorf("read %q, %v; want the 10 bytes sent, then unexpected EOF", data, err)
			}
			if n := tr.idleCount(strings.TrimPrefix(url, "http://")); n != 0 {
				t.Errorf("%d idle connections, want 0", n)
			}
			_, _, _ = roundTrip(t, tr, url, "y")
			if n := accepted.Load(); n != 2 {
				t.Errorf("%d connections for two requests, want 2", n)
			}
		})
	}
}

func TestCancelMidStreamUnblocksRead(t *testing.T) {
	errIdle := errors.New("backend idle timeout")
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"client gone", nil},
		{"the proxy's idle watchdog, with a cause", errIdle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: 1\n\n")
				w.(http.Flusher).Flush()
				<-release
			})
			tr := &Transport{}
			defer tr.CloseIdleConnections()
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			resp, err := post(t, tr, ctx, s.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			buf := make([]byte, 64)
			if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "data: 1\n\n" {
				t.Fatalf("first read %q, %v", buf[:n], err)
			}
			time.AfterFunc(50*time.Millisecond, func() { cancel(tc.cause) })
			start := time.Now()
			_, err = resp.Body.Read(buf)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Read returned %v after the cancel", took)
			}
			if !errors.Is(err, context.Canceled) || tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Errorf("Read: %v, want context.Canceled (and the cause %v)", err, tc.cause)
			}
			if n := tr.idleCount(s.addr()); n != 0 {
				t.Errorf("%d idle connections, want 0", n)
			}
		})
	}
}

func TestSSEChunksArriveOneByOne(t *testing.T) {
	const events = 5
	got := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			// The next event is sent only once the client has this one:
			// anything buffering the stream deadlocks here.
			select {
			case <-got:
			case <-time.After(5 * time.Second):
				t.Errorf("event %d did not reach the client before the next was sent", i)
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	resp, err := post(t, tr, t.Context(), s.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != -1 || len(resp.TransferEncoding) == 0 {
		t.Fatalf("answer of length %d, %v: want chunked", resp.ContentLength, resp.TransferEncoding)
	}
	buf := make([]byte, 32<<10)
	for i := range events {
		n, err := resp.Body.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("data: %d\n\n", i); string(buf[:n]) != want {
			t.Fatalf("read %d: %q, want %q alone", i, buf[:n], want)
		}
		got <- struct{}{}
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "data: [DONE]\n\n" {
		t.Errorf("end of the stream %q, %v", rest, err)
	}
	if n := tr.idleCount(s.addr()); n != 1 {
		t.Errorf("%d idle connections after a whole stream, want 1", n)
	}
}

func TestResponseHeaderBytesAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		header  int
		wantErr bool
	}{
		{"within the bound", 30 << 10, false},
		{"beyond the bound", 100 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Big", strings.Repeat("a", tc.header))
				io.WriteString(w, "ok")
			})
			tr := &Transport{MaxResponseHeaderBytes: 64 << 10}
			defer tr.CloseIdleConnections()
			_, body, err := roundTrip(t, tr, s.URL, "x")
			if tc.wantErr != (err != nil) || tc.wantErr && !errors.Is(err, ErrResponseHeaderTooLarge) || !tc.wantErr && body != "ok" {
				t.Errorf("headers of %d bytes: %q, %v", tc.header, body, err)
			}
		})
	}
}

func TestUnboundedInformationalAnswersAreBounded(t *testing.T) {
	url, _ := rawServer(t, func(_ int, c net.Conn) {
		if _, _, err := readRequest(bufio.NewReader(c)); err != nil {
			return
		}
		for {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"); err != nil {
				return
			}
		}
	})
	tr := &Transport{MaxResponseHeaderBytes: 64 << 10}
	defer tr.CloseIdleConnections()
	if _, _, err := roundTrip(t, tr, url, "x"); !errors.Is(err, ErrResponseHeaderTooLarge) {
		t.Errorf("endless 1xx answers: %v, want ErrResponseHeaderTooLarge", err)
	}
}

func TestInformationalAnswersAreSkipped(t *testing.T) {
	url, accepted := rawServer(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
		}
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for range 2 {
		status, body, err := roundTrip(t, tr, url, "x")
		if err != nil || status != http.StatusCreated || body != "done" {
			t.Errorf("%d %q %v, want 201 done", status, body, err)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

func TestAnswersThatEndTheConnectionAreNotReused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer string
		close  bool // the request says Connection: close
	}{
		{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		{"the request marked Close", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, accepted := rawServer(t, func(_ int, c net.Conn) {
				br := bufio.NewReader(c)
				for {
					if _, _, err := readRequest(br); err != nil {
						return
					}
					io.WriteString(c, tc.answer)
				}
			})
			tr := &Transport{}
			defer tr.CloseIdleConnections()
			for range 3 {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("x"))
				req.Close = tc.close
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				data, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(data) != "ok" {
					t.Fatalf("%q %v", data, err)
				}
			}
			if n := accepted.Load(); n != 3 {
				t.Errorf("%d connections for 3 requests, want 3", n)
			}
			if n := tr.idleCount(strings.TrimPrefix(url, "http://")); n != 0 {
				t.Errorf("%d idle connections, want 0", n)
			}
		})
	}
}

func TestCloseBeforeTheEndClosesTheConnection(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part one ")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part two")
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	resp, err := post(t, tr, t.Context(), s.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(buf); err == nil {
		t.Error("Read after Close succeeded")
	}
	if n := tr.idleCount(s.addr()); n != 0 {
		t.Errorf("%d idle connections, want 0", n)
	}
	if _, body, err := roundTrip(t, tr, s.URL, "x"); err != nil || body != "part one part two" {
		t.Fatalf("%q %v", body, err)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

func TestOtherRequestsGoToTheFallback(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"https", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "https://127.0.0.1:1/v1/completions", strings.NewReader("x"))
			return r
		}},
		{"unix", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "unix:///run/engine.sock", nil)
			return r
		}},
		{"a body of unknown length", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", io.MultiReader(strings.NewReader("x")))
			return r
		}},
		{"user info", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "http://u:p@127.0.0.1:1/", nil)
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *http.Request
			tr := &Transport{Fallback: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				got = r
				return &http.Response{StatusCode: http.StatusTeapot, Body: http.NoBody, Request: r}, nil
			})}
			req := tc.req()
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusTeapot || got != req {
				t.Errorf("%v, %v: want the fallback's answer", resp, err)
			}
			if _, err := (&Transport{}).RoundTrip(tc.req()); err == nil {
				t.Error("no fallback: no error")
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestDeadlineWhileWaitingForHeaders(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := post(t, tr, ctx, s.URL, "x")
	if resp != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v, %v: want context.DeadlineExceeded", resp, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned after %v", took)
	}
	if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
		t.Errorf("%v is not a timeout net.Error", err)
	}
}

func TestCanceledContextBeforeTheRequest(t *testing.T) {
	s := newServer(t, echo)
	tr := &Transport{}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := post(t, tr, ctx, s.URL, "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("%v, want context.Canceled", err)
	}
	if n := s.accepted.Load(); n != 0 {
		t.Errorf("%d connections, want 0", n)
	}
}

func TestUnreachableIsTheDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	tr := &Transport{ConnectTimeout: time.Second}
	if _, err := post(t, tr, t.Context(), url, "x"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%v, want connection refused", err)
	}
}

func TestEarlyAnswerIsReadAfterAFailedWrite(t *testing.T) {
	url, _ := rawServer(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		// Refused before the body is read, as a server whose body limit is
		// smaller than the request does.
		io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big\n")
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	status, body, err := roundTrip(t, tr, url, strings.Repeat("x", 32<<20))
	if err != nil || status != http.StatusRequestEntityTooLarge || body != "too big\n" {
		t.Errorf("%d %q %v, want the server's 413", status, body, err)
	}
}

func TestIdleConnectionsExpire(t *testing.T) {
	s := newServer(t, echo)
	tr := &Transport{IdleConnTimeout: 50 * time.Millisecond}
	defer tr.CloseIdleConnections()
	if _, _, err := roundTrip(t, tr, s.URL, "x"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.closed.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := tr.idleCount(s.addr()); n != 0 || s.closed.Load() != 1 {
		t.Errorf("after the idle timeout: %d idle, %d closed; want 0 and 1", n, s.closed.Load())
	}
	if _, _, err := roundTrip(t, tr, s.URL, "x"); err != nil {
		t.Fatal(err)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

func TestCloseIdleConnections(t *testing.T) {
	s := newServer(t, echo)
	fallback := &closeCounter{}
	tr := &Transport{Fallback: fallback}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { _, _, _ = roundTrip(t, tr, s.URL, fmt.Sprint(i)) })
	}
	wg.Wait()
	open := s.accepted.Load()
	tr.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for s.closed.Load() < open && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.closed.Load() != open || tr.idleCount(s.addr()) != 0 || fallback.n.Load() != 1 {
		t.Errorf("%d of %d connections closed, %d idle, fallback's closed %d times", s.closed.Load(), open, tr.idleCount(s.addr()), fallback.n.Load())
	}
}

type closeCounter struct {
	roundTripFunc
	n atomic.Int32
}

func (c *closeCounter) CloseIdleConnections() { c.n.Add(1) }

func TestInvalidHeadersAreRefusedBeforeAnyByteIsSent(t *testing.T) {
	s := newServer(t, echo)
	tr := &Transport{}
	for _, tc := range []struct {
		name string
		edit func(*http.Request)
	}{
		{"a header value with CR LF", func(r *http.Request) { r.Header["X-Evil"] = []string{"a\r\nX-Injected: 1"} }},
		// A URL built field by field (url.Parse refuses control bytes)
		// can carry them in its raw query; net/http refuses it too.
		{"a raw query with CR LF", func(r *http.Request) { r.URL.RawQuery = "a HTTP/1.1\r\nX-Injected: 1\r\nX:" }},
		{"an opaque URL with a control byte", func(r *http.Request) { r.URL.Opaque = "/a\x00" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader("x"))
			tc.edit(req)
			if _, err := tr.RoundTrip(req); err == nil {
				t.Error("sent")
			}
		})
	}
	if n := s.accepted.Load(); n != 0 {
		t.Errorf("%d connections, want 0", n)
	}
}

func TestBodiesArriveWhole(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %s %x", len(body), r.Header.Get("Content-Length"), sha256.Sum256(body))
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for _, size := range []int{1, inlineBodyBytes, inlineBodyBytes + 1, 1 << 20} {
		data := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
		want := fmt.Sprintf("%d %d %x", size, size, sha256.Sum256(data))
		for _, kind := range []string{"bytes.Reader", "another reader"} {
			t.Run(fmt.Sprintf("%s of %d bytes", kind, size), func(t *testing.T) {
				var body io.Reader = bytes.NewReader(data)
				if kind != "bytes.Reader" {
					body = strings.NewReader(string(data))
				}
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL, body)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(got) != want {
					t.Errorf("server got %s, want %s", got, want)
				}
			})
		}
	}
	if n := s.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

func TestBodyShorterThanItsLengthIsNotSent(t *testing.T) {
	s := newServer(t, echo)
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for _, n := range []int64{10, 10 << 10} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL, io.NopCloser(strings.NewReader("short")))
		req.ContentLength = n
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "ContentLength") {
			t.Errorf("ContentLength %d with a 5-byte body: %v", n, err)
		}
	}
}
