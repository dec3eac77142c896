package proxy

import (
	"bytes"
	"strconv"
)

// outputCount counts a decode answer's output tokens as the relay passes
// it on, for the planner, which would otherwise take every request's
// max_tokens for its output: the answer's usage.completion_tokens where
// it has one (a whole answer; a stream with stream_options.include_usage),
// else a stream's events (one token each, as the engines send them).
type outputCount struct {
	events int
	// carry is the end of the bytes seen, for an event marker split
	// between two reads; tail the last tailBytes, where usage is.
	carry, tail []byte
}

// tailBytes is how much of an answer's end is kept for its usage.
const tailBytes = 512

var (
	// eventMarker starts an SSE event: at the start of a line (the count
	// starts with a newline carried, for the answer's first line).
	eventMarker = []byte("\ndata: ")
	doneEvent   = []byte("\ndata: [DONE]")
	usageKey    = []byte(`"completion_tokens":`)
)

// feed counts the events in b, the next bytes of the answer. A nil count
// does nothing (the planner is off).
func (c *outputCount) feed(b []byte) {
	if c == nil || len(b) == 0 {
		return
	}
	buf := append(c.carry, b...)
	// carry is the part of the bytes seen not yet judged: a marker too
	// near the end to tell [DONE] from an event, or what may start one.
	var carry []byte
	for i := 0; ; {
		j := bytes.Index(buf[i:], eventMarker)
		if j < 0 {
			carry = buf[max(len(buf)-len(eventMarker)+1, i):]
			break
		}
		at := i + j
		if len(buf)-at < len(doneEvent) {
			carry = buf[at:]
			break
		}
		if !bytes.HasPrefix(buf[at:], doneEvent) {
			c.events++
		}
		i = at + len(eventMarker)
	}
	c.carry = bytes.Clone(carry)
	c.tail = append(c.tail, b...)
	if len(c.tail) > tailBytes {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-tailBytes:]...)
	}
}

// tokens is the answer's output tokens: its last usage's
// completion_tokens, else its events when it streamed; ok is false when
// neither tells.
func (c *outputCount) tokens(stream bool) (n int, ok bool) {
	if c == nil {
		return 0, false
	}
	if i := bytes.LastIndex(c.tail, usageKey); i >= 0 {
		rest := bytes.TrimLeft(c.tail[i+len(usageKey):], " ")
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if v, err := strconv.Atoi(string(rest[:end])); err == nil {
			return v, true
		}
	}
	if stream && c.events > 0 {
		return c.events, true
	}
	return 0, false
}

// newOutputCount is a count for a relay when the planner runs, else nil.
func (p *Proxy) newOutputCount() *outputCount {
	if p.plan == nil {
		return nil
	}
	return &outputCount{carry: []byte("\n")}
}

// observeOutput tells the planner what the request id produced, once its
// answer was relayed whole.
func (p *Proxy) observeOutput(id string, c *outputCount, stream bool) {
	n, ok := c.tokens(stream)
	if !ok || p.plan == nil {
		return
	}
	p.plan.mu.Lock()
	p.plan.pl.ObserveOutput(id, n, p.now())
	p.plan.mu.Unlock()
}
