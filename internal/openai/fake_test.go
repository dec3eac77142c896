package openai

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
)

// byteTokenizer is a test tokenizer: token 1 is BOS, token 3+b is byte b.
type byteTokenizer struct{}

func (byteTokenizer) Encode(text string, addSpecial bool) []int32 {
	var ids []int32
	if addSpecial {
		ids = append(ids, 1)
	}
	for i := 0; i < len(text); i++ {
		ids = append(ids, int32(text[i])+3)
	}
	return ids
}

func (byteTokenizer) Decode(ids []int32, skipSpecial bool) string {
	var b []byte
	for _, id := range ids {
		if id >= 3 {
			b = append(b, byte(id-3))
		} else if !skipSpecial {
			b = append(b, "<s>"...)
		}
	}
	return string(b)
}

func (t byteTokenizer) TokenText(id int32) string { return t.Decode([]int32{id}, false) }
func (byteTokenizer) VocabSize() int              { return 259 }

// fakeBackend answers each request with the events script returns, one per
// channel send. A nil script blocks until the request's context ends.
type fakeBackend struct {
	maxLen int
	ready  bool
	script func(r *engine.Request) []engine.Event
	// hold keeps a request open after its scripted events until its
	// context ends, like a long generation.
	hold bool
	err  error

	mu       sync.Mutex
	reqs     []*engine.Request
	aborted  []string
	inflight int
	done     chan struct{} // receives once per ended request goroutine
}

func newFakeBackend(script func(r *engine.Request) []engine.Event) *fakeBackend {
	return &fakeBackend{maxLen: 64, ready: true, script: script, done: make(chan struct{}, 16)}
}

func (b *fakeBackend) Submit(ctx context.Context, r *engine.Request) (*engine.Handle, error) {
	if b.err != nil {
		return nil, b.err
	}
	b.mu.Lock()
	b.reqs = append(b.reqs, r)
	b.inflight++
	b.mu.Unlock()
	ch := make(chan engine.Event)
	go func() {
		defer func() {
			close(ch)
			b.mu.Lock()
			b.inflight--
			b.mu.Unlock()
			b.done <- struct{}{}
		}()
		if b.script == nil {
			<-ctx.Done()
			return
		}
		for _, ev := range b.script(r) {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
		if b.hold {
			<-ctx.Done()
		}
	}()
	return &engine.Handle{ID: r.ID, Events: ch}, nil
}

func (b *fakeBackend) Abort(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.aborted = append(b.aborted, id)
}

func (b *fakeBackend) Ready() bool      { return b.ready }
func (b *fakeBackend) MaxModelLen() int { return b.maxLen }

func (b *fakeBackend) requests() []*engine.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*engine.Request(nil), b.reqs...)
}

// waitIdle waits until no request goroutine is running.
func (b *fakeBackend) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		b.mu.Lock()
		n := b.inflight
		b.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-b.done:
		case <-deadline:
			t.Fatalf("%d fake requests still running", n)
		}
	}
}

// echoScript generates the prompt's last bytes back, one token per event,
// and finishes with reason length after MaxTokens tokens.
func echoScript(text string) func(r *engine.Request) []engine.Event {
	return func(r *engine.Request) []engine.Event {
		var evs []engine.Event
		n := min(r.Params.MaxTokens, len(text))
		for i := range n {
			ev := engine.Event{Tokens: []int32{int32(text[i]) + 3}, Text: text[i : i+1]}
			if r.Params.Logprobs >= 0 {
				ev.Logprobs = []engine.TokenLogprob{{Token: int32(text[i]) + 3, Logprob: -0.5, Top: topN(r.Params.Logprobs)}}
			}
			evs = append(evs, ev)
		}
		finish := engine.FinishLength
		if n < r.Params.MaxTokens {
			finish = engine.FinishStop
		}
		evs = append(evs, engine.Event{Finish: finish, Usage: engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: n, CachedTokens: 1}})
		return evs
	}
}

func topN(n int) []engine.TopLogprob {
	var top []engine.TopLogprob
	for i := range n {
		top = append(top, engine.TopLogprob{Token: int32('a'+i) + 3, Logprob: -float32(i + 1)})
	}
	return top
}

// newTestServer starts a server over b on a loopback listener.
func newTestServer(t *testing.T, b *fakeBackend, mod func(*Config)) (*Server, *httptest.Server) {
	t.Helper()
	cfg := Config{
		Backend:   b,
		Tokenizer: byteTokenizer{},
		ModelName: "m",
		ModelRoot: "/models/m",
		Version:   "test",
		ChatTemplate: func(msgs []Message, gen bool) (string, error) {
			var s string
			for _, m := range msgs {
				s += "<" + m.Role + ">" + m.Content
			}
			if gen {
				s += "<assistant>"
			}
			return s, nil
		},
		Now: func() time.Time { return time.Unix(1700000000, 0) },
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}
