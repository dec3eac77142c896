package engine

import (
	"context"
	"sync"
)

// stream is the mailbox between the step loop and one request's consumer.
// The loop merges into pending and never blocks; a per-request forwarder
// goroutine moves the merged event onto the Handle's channel at the pace
// the consumer reads.
type stream struct {
	mu      sync.Mutex
	pending Event
	has     bool
	final   bool
	wake    chan struct{} // capacity 1: "pending changed"
}

func newStream() *stream { return &stream{wake: make(chan struct{}, 1)} }

// push merges ev into the pending event; final marks the request's last
// event. Called by the step loop only.
func (s *stream) push(ev Event, final bool) {
	s.mu.Lock()
	p := &s.pending
	p.Tokens = append(p.Tokens, ev.Tokens...)
	p.Text += ev.Text
	p.Logprobs = append(p.Logprobs, ev.Logprobs...)
	if ev.Timing != nil && p.Timing == nil {
		p.Timing = ev.Timing
	}
	if final {
		p.Finish, p.StopReason, p.Err, p.KVTransfer, p.Usage = ev.Finish, ev.StopReason, ev.Err, ev.KVTransfer, ev.Usage
		s.final = true
	}
	s.has = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stream) take() (ev Event, has, final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev, has, final = s.pending, s.has, s.final
	s.pending, s.has = Event{}, false
	return ev, has, final
}

// forward delivers a request's events on out until the final one, then
// closes out. When ctx ends first (the client went away) it aborts the
// request, waits for the final event and offers it without blocking, since
// nobody may be reading any more.
func (s *stream) forward(ctx context.Context, out chan<- Event, abort func()) {
	defer close(out)
	done := ctx.Done() // nil for a context that never ends
	gone := false      // the client went away: deliver only the final event
	for {
		select {
		case <-s.wake:
		case <-done:
			abort()
			done, gone = nil, true
			continue
		}
		ev, has, final := s.take()
		switch {
		case !has:
			continue
		case gone:
			if final {
				select {
				case out <- ev:
				default:
				}
				return
			}
			continue
		}
		select {
		case out <- ev:
		case <-done:
			abort()
			done, gone = nil, true
			if final {
				return
			}
			continue
		}
		if final {
			return
		}
	}
}
