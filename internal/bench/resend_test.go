package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// idleClosingServer is a real TCP HTTP/1.1 server that answers the first
// completion on each connection with a one-token stream, keeping the
// connection alive, and treats the second request on a connection as a
// server whose idle timeout fired as it arrived: it reads it and closes
// the connection, after writing partial bytes of an answer if partial is
// set.
type idleClosingServer struct {
	ln       net.Listener
	partial  bool
	requests atomic.Int32 // requests read, over all connections
	conns    atomic.Int32
	wg       sync.WaitGroup
}

func newIdleClosingServer(t *testing.T, partial bool) *idleClosingServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &idleClosingServer{ln: ln, partial: partial}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *idleClosingServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		s.requests.Add(1)
		if n == 1 {
			if s.partial {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
			}
			return // the idle timeout: closed without (a whole) answer
		}
		sse := "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(sse), sse)
	}
}

func (s *idleClosingServer) url() string { return "http://" + s.ln.Addr().String() }

func streamOnce(t *testing.T, c *Client) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Stream(ctx, CompletionRequest{Model: "m", Prompt: []int32{1}, MaxTokens: 1})
}

// TestStreamResendsWhenTheKeptAliveConnectionWasClosed: the second request
// goes out on the pooled connection, which the server closes before
// answering; the client sends it again on a fresh connection and it
// completes, marked Resent.
func TestStreamResendsWhenTheKeptAliveConnectionWasClosed(t *testing.T) {
	s := newIdleClosingServer(t, false)
	c := NewClient(s.url(), 1)
	if o := streamOnce(t, c); o.Err != nil || o.Resent {
		t.Fatalf("first request: err %v, resent %t", o.Err, o.Resent)
	}
	o := streamOnce(t, c)
	if o.Err != nil || !o.Resent || o.Text != "hi" {
		t.Fatalf("second request on the closed kept-alive connection: err %v, resent %t, text %q; want it resent and complete", o.Err, o.Resent, o.Text)
	}
	if got := s.requests.Load(); got != 3 {
		t.Fatalf("the server read %d requests, want 3 (one lost to the closed connection)", got)
	}
	if got := s.conns.Load(); got != 2 {
		t.Fatalf("%d connections, want 2 (the resend on a fresh one)", got)
	}
	r := NewReport("m", Load{Concurrency: 1}, time.Second, []Outcome{o})
	if r.Resent != 1 || r.Failed != 0 {
		t.Fatalf("report: resent %d, failed %d; want 1 and 0", r.Resent, r.Failed)
	}
}

// TestStreamNeverResendsAfterAnAnswerByte: once any byte of an answer has
// arrived the server has the request, and the failure is reported, not
// hidden by a second send.
func TestStreamNeverResendsAfterAnAnswerByte(t *testing.T) {
	s := newIdleClosingServer(t, true)
	c := NewClient(s.url(), 1)
	if o := streamOnce(t, c); o.Err != nil {
		t.Fatalf("first request: %v", o.Err)
	}
	o := streamOnce(t, c)
	if o.Err == nil || o.Resent {
		t.Fatalf("a connection closed mid-answer: err %v, resent %t; want a failure, not resent", o.Err, o.Resent)
	}
	if got := s.requests.Load(); got != 2 {
		t.Fatalf("the server read %d requests, want 2", got)
	}
}
