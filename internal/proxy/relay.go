package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// relayBufferBytes is the size of the relay's read buffers.
const relayBufferBytes = 32 << 10

// relayBuffers are the decode relay's read buffers, reused across requests.
var relayBuffers = sync.Pool{New: func() any { b := make([]byte, relayBufferBytes); return &b }}

// sseDone is the last event of an OpenAI stream.
var sseDone = []byte("data: [DONE]")

// isEventStream reports whether a Content-Type is SSE's.
func isEventStream(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// relay copies one decode answer to the client.
type relay struct {
	p   *Proxy
	w   http.ResponseWriter
	rc  *http.ResponseController
	r   *http.Request
	id  string
	leg *decodeLeg
	a   *decodeAttempt
	// whole says the answer has a known length: relayed with it, without a
	// flush per read.
	whole bool
	// capture takes conversation mode's params out of a 200 answer; nil
	// otherwise.
	capture *kvCapture
	// tail keeps the last bytes relayed: a client may hang up as soon as it
	// has read an SSE stream's "data: [DONE]", before the decode's EOF
	// reaches the proxy; such a stream was delivered whole.
	tail []byte
	// out counts the answer's output tokens for the planner (nil when it
	// is off).
	out *outputCount
}

// relay writes the decode's status and headers, then its body as it
// arrives, and returns the request's outcome.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, id string, leg *decodeLeg, a *decodeAttempt) string {
	h := w.Header()
	copyResponseHeaders(h, a.resp.Header)
	h.Set("X-Request-Id", id)
	h.Set(HeaderPD, leg.pd)
	addTiming(h, leg, a.start)

	rl := &relay{p: p, w: w, rc: http.NewResponseController(w), r: r, id: id, leg: leg, a: a, out: p.newOutputCount()}
	rl.capture = leg.turn.newCapture(a.resp)
	defer p.releaseUnkept(rl.capture, a.b, id)
	// A stream (SSE, or any answer of unknown length) is flushed chunk by
	// chunk as it arrives. An answer of known length is one piece the decode
	// sent when it was done: relayed with its length and without a flush per
	// read, it leaves in one write (handleGenerate's flush) instead of a
	// chunked body and its terminating chunk. A conversation's capture edits
	// the answer, so its length is not known in advance.
	rl.whole = rl.capture == nil && a.resp.ContentLength >= 0 && !isEventStream(a.resp.Header.Get("Content-Type"))
	if rl.whole {
		h["Content-Length"] = []string{strconv.FormatInt(a.resp.ContentLength, 10)}
	}
	w.WriteHeader(a.resp.StatusCode)
	return rl.copy()
}

// copy is the relay's loop: it starts with the attempt's first read
// (tryDecode's, under the first-byte deadline); each later read from the
// decode is bounded by the attempt's watchdog at Config.StallTimeout, each
// write to the client by its write deadline.
func (rl *relay) copy() string {
	buf := *rl.a.buf // the attempt's: end returns it to relayBuffers
	n, rerr := rl.a.n, rl.a.rerr
	if n > 0 {
		rl.p.metrics.decodeTTFB.Observe(rl.a.firstAt.Sub(rl.a.start).Seconds())
	}
	for {
		if n > 0 {
			if err := rl.send(rl.capture.feed(buf[:n])); err != nil {
				return outcomeClientCanceled
			}
		}
		if rerr == io.EOF {
			return rl.done()
		}
		if rerr != nil {
			return rl.cut(rerr)
		}
		rl.a.watchdog.Reset(rl.p.cfg.StallTimeout)
		n, rerr = rl.a.resp.Body.Read(buf)
		rl.a.watchdog.Stop()
	}
}

// send writes out to the client and remembers its tail.
func (rl *relay) send(out []byte) error {
	if len(out) == 0 {
		return nil
	}
	_ = rl.rc.SetWriteDeadline(time.Now().Add(rl.p.cfg.Timeout))
	if _, err := rl.w.Write(out); err != nil {
		return err
	}
	if !rl.whole {
		if err := rl.rc.Flush(); err != nil {
			return err
		}
	}
	rl.out.feed(out)
	rl.tail = append(rl.tail, out...)
	if len(rl.tail) > 64 {
		rl.tail = append(rl.tail[:0], rl.tail[len(rl.tail)-64:]...)
	}
	return nil
}

// done ends a whole answer: conversation mode relays what its capture still
// holds and keeps the decode's params only when the client got it all.
// handleGenerate flushes what is buffered and clears the write deadline.
func (rl *relay) done() string {
	if !rl.leg.turn.afterDecode(rl.capture, rl.a.b, rl.id, rl.send) {
		return outcomeClientCanceled
	}
	rl.p.observeOutput(rl.id, rl.out, isEventStream(rl.a.resp.Header.Get("Content-Type")))
	return rl.leg.success
}

// cut ends a relay whose read from the decode failed: a success if the
// client, now gone, had the stream's last event; else the client's leaving,
// or a stream broken by the decode (or its silence).
func (rl *relay) cut(rerr error) string {
	if rl.r.Context().Err() != nil {
		if bytes.HasSuffix(bytes.TrimRight(rl.tail, "\r\n"), sseDone) {
			return rl.done()
		}
		return outcomeClientCanceled
	}
	cause := rerr
	if rl.a.idle() {
		cause = fmt.Errorf("no data for %v (the proxy's --stall-timeout)", rl.p.cfg.StallTimeout)
	}
	rl.p.log.Warn("decode answer cut off", "request_id", rl.id, "backend", rl.a.b.base, "err", cause)
	return outcomeStreamBroken
}
