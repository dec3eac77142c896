package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router/factory"
)

// firstRefused is two decode engines: whichever gets the first decode leg
// answers it 503, as a draining engine does, and every later leg is served
// by next.
type firstRefused struct {
	engines [2]*fakeEngine
	calls   atomic.Int32
	refused atomic.Int32 // index of the engine that answered 503
}

func newFirstRefused(t *testing.T, next func(w http.ResponseWriter, r *http.Request, body []byte)) *firstRefused {
	f := &firstRefused{}
	for i := range f.engines {
		f.engines[i] = newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			if f.calls.Add(1) == 1 {
				f.refused.Store(int32(i))
				drainingEngine(w, r, body)
				return
			}
			next(w, r, body)
		})
	}
	return f
}

// backendOf returns the proxy's decode backend for f.
func backendOf(t *testing.T, p *Proxy, f *fakeEngine) *backend {
	t.Helper()
	for _, b := range p.decode.list() {
		if b.base == f.URL() {
			return b
		}
	}
	t.Fatalf("no decode backend %s", f.URL())
	return nil
}

// await fails t unless ch is closed within 10 s.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen within 10s", what)
	}
}

// TestDecodeRetryOutlivesTheFailedAttemptsWatchdog fires the watchdog of a
// decode attempt that answered 503 while the retry on another decode waits
// for its answer: the watchdog was the first attempt's, and must not cut
// the second.
func TestDecodeRetryOutlivesTheFailedAttemptsWatchdog(t *testing.T) {
	reached, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	decodes := newFirstRefused(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		once.Do(func() { close(reached) })
		select {
		case <-proceed:
			decodeJSON(w, r, body)
		case <-r.Context().Done():
		}
	})
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{newFake(t, prefillOK)}, decodes.engines[:])
	var mu sync.Mutex
	var watchdogs []func()
	p.afterFunc = func(d time.Duration, f func()) *time.Timer {
		mu.Lock()
		defer mu.Unlock()
		watchdogs = append(watchdogs, f)
		return time.AfterFunc(time.Hour, func() {}) // fired by the test alone
	}

	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
		done <- answer{resp.StatusCode, body}
	}()
	await(t, reached, "the retry reaching the second decode")
	mu.Lock()
	first := watchdogs[0]
	mu.Unlock()
	first() // the 503 attempt's watchdog, late
	close(proceed)
	if a := <-done; a.status != http.StatusOK || !strings.Contains(a.body, "hello") {
		t.Errorf("answer %d %s; want the second decode's 200: the first attempt's watchdog cancelled the retry", a.status, a.body)
	}
}

// TestFailedDecodeAttemptStopsCountingOnItsBackend streams an answer from
// the decode that took the request after another answered 503: while the
// stream runs, the failed backend has nothing in flight (the load-aware
// pickers read it), and the serving one has the request.
func TestFailedDecodeAttemptStopsCountingOnItsBackend(t *testing.T) {
	proceed := make(chan struct{})
	decodes := newFirstRefused(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"hel\"}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-proceed:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1}, []*fakeEngine{newFake(t, prefillOK)}, decodes.engines[:])
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "hel") {
		t.Fatalf("first line of the stream %q, %v", line, err)
	}
	// The first event reached the client: the relay of the second attempt
	// runs, and the first attempt has ended.
	failed := backendOf(t, p, decodes.engines[decodes.refused.Load()])
	serving := backendOf(t, p, decodes.engines[1-decodes.refused.Load()])
	if n, tok := failed.inFlight.Load(), failed.inTokens.Load(); n != 0 || tok != 0 {
		t.Errorf("the decode that answered 503 still counts %d request(s), %d token(s) in flight during the other's stream; want 0", n, tok)
	}
	if n := serving.inFlight.Load(); n != 1 {
		t.Errorf("the streaming decode counts %d request(s) in flight, want 1", n)
	}
	close(proceed)
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Errorf("rest of the stream %q, %v; want it through [DONE]", rest, err)
	}
}

// TestLocalPrefillTokensCountUntilTheFirstByte: a local prefill's prompt
// counts on its decode (Endpoint.LocalPrefillTokens, the priced decider's
// view of the decode's queue) from when it is sent until the decode's first
// byte; a remote leg's does not.
func TestLocalPrefillTokensCountUntilTheFirstByte(t *testing.T) {
	for _, tt := range []struct {
		decider string
		local   bool
	}{{"conditional", true}, {"always", false}} {
		t.Run(tt.decider, func(t *testing.T) {
			started, release := make(chan struct{}, 1), make(chan struct{})
			pre := []*fakeEngine{newFake(t, prefillOK)}
			dec := []*fakeEngine{newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				started <- struct{}{}
				<-release
				decodeJSON(w, r, body)
			})}
			p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, PDDecider: tt.decider,
				Router: factory.Options{Threshold: 1 << 20}}, pre, dec)
			done := make(chan struct{})
			go func() {
				defer close(done)
				post(t, url, "/v1/completions", `{"prompt":"a prompt of a few tokens, prefilled where the decider says"}`, nil)
			}()
			<-started
			b := p.decode.list()[0]
			if got := b.endpoint(time.Now(), 0, 0).LocalPrefillTokens; (got > 0) != tt.local {
				t.Errorf("while the decode computes: LocalPrefillTokens = %d, want > 0: %v", got, tt.local)
			}
			close(release)
			<-done
			if got := b.inLocal.Load(); got != 0 {
				t.Errorf("after the answer: %d local prefill tokens counted, want 0", got)
			}
		})
	}
}
