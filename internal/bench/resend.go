package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"syscall"
)

// A server with a short keep-alive idle timeout (llama-server closes
// connections idle for 5 s) can close a pooled connection just as the
// client sends on it; the POST then fails with "server closed idle
// connection", EOF or a reset without the server having seen it, and
// net/http does not retry a POST by itself. Stream detects exactly that
// case and sends again on a fresh connection: the server's keep-alive
// policy is not a benchmark failure. It never sends again once any byte of
// an answer has arrived.

// post sends body as a streaming completion with hc. reusedClosed reports
// that it failed on a reused connection before any byte of an answer
// arrived, because the connection was closed (see closedConn).
func (c *Client) post(ctx context.Context, hc *http.Client, body []byte) (resp *http.Response, reusedClosed bool, err error) {
	var reused, answered bool
	trace := &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { reused = i.Reused },
		GotFirstResponseByte: func() { answered = true },
	}
	hr, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, c.BaseURL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	if c.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err = hc.Do(hr)
	return resp, err != nil && reused && !answered && closedConn(err), err
}

// closedConn reports whether err says the peer had closed the connection:
// net/http's "server closed idle connection", an EOF, a reset or a broken
// pipe (not a timeout or a cancellation).
func closedConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "server closed idle connection")
}

// freshClient returns a client that opens a new connection for every
// request (c.HTTP's transport without keep-alives), for the resend.
func (c *Client) freshClient() *http.Client {
	c.freshOnce.Do(func() {
		c.fresh = c.HTTP
		if tr, ok := c.HTTP.Transport.(*http.Transport); ok {
			t := tr.Clone()
			t.DisableKeepAlives = true
			c.fresh = &http.Client{Transport: t, CheckRedirect: c.HTTP.CheckRedirect, Jar: c.HTTP.Jar}
		} else if c.HTTP.Transport == nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.DisableKeepAlives = true
			c.fresh = &http.Client{Transport: t, CheckRedirect: c.HTTP.CheckRedirect, Jar: c.HTTP.Jar}
		}
	})
	return c.fresh
}
