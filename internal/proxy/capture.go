package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
)

// maxCaptureBytes bounds what kvCapture holds back: a whole non-streaming
// answer, or one SSE line. Beyond it the capture gives up and the rest of
// the answer is relayed untouched (the turn is then not remembered).
const maxCaptureBytes = 16 << 20

// kvCapture takes a decode's kv_transfer_params out of its answer while the
// answer is relayed, in conversation mode: the proxy keeps them for the
// conversation's next turn, and the client never sees them (they name an
// engine's internal address and held blocks, and the proxy would not accept
// them back from a client anyway). Every other byte is relayed as the decode
// sent it.
//
// An SSE answer is relayed line by line (an engine flushes whole events, so
// this delays nothing); a data line whose chunk holds a kv_transfer_params
// object is captured and rewritten without the field. A JSON answer (the
// decode sends it in one piece when it is done) is held whole, and the
// top-level field is taken out at the end.
type kvCapture struct {
	sse    bool
	held   []byte
	done   bool // gave up: relay the rest untouched
	params json.RawMessage
	kept   bool // convTurn.keep (or releaseUnkept) took care of params
	// wantAnswer collects the text of choice 0 in answer (a turn to
	// remember by its history); answerBad says it could not be read whole.
	wantAnswer bool
	answer     []byte
	answerBad  bool
}

func newKVCapture(contentType string) *kvCapture {
	return &kvCapture{sse: strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream")}
}

// feed takes bytes read from the decode and returns those to relay now;
// a nil capture (none) relays them all.
func (c *kvCapture) feed(p []byte) []byte {
	if c == nil || c.done {
		return p
	}
	c.held = append(c.held, p...)
	if !c.sse {
		if len(c.held) > maxCaptureBytes {
			return c.giveUp()
		}
		return nil
	}
	end := bytes.LastIndexByte(c.held, '\n')
	if end < 0 {
		if len(c.held) > maxCaptureBytes {
			return c.giveUp()
		}
		return nil
	}
	lines := c.held[:end+1]
	var out []byte
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		out = append(out, c.line(lines[:i+1])...)
		lines = lines[i+1:]
	}
	c.held = append(c.held[:0], c.held[end+1:]...)
	return out
}

// finish returns what is still held back once the decode's body has ended.
func (c *kvCapture) finish() []byte {
	if c.done {
		return nil
	}
	rest := c.held
	c.held = nil
	if c.sse {
		return c.line(rest)
	}
	c.collect(rest)
	return c.takeParams(rest)
}

// giveUp relays what is held and stops capturing.
func (c *kvCapture) giveUp() []byte {
	c.done = true
	c.answerBad = true
	out := c.held
	c.held = nil
	return out
}

// line returns an SSE line as it should be relayed.
func (c *kvCapture) line(l []byte) []byte {
	payload, ok := bytes.CutPrefix(l, []byte("data:"))
	if ok {
		c.collect(bytes.TrimSpace(payload))
	}
	if !ok || !bytes.Contains(payload, []byte(kvParamsKey)) {
		return l
	}
	body := bytes.TrimRight(payload, "\r\n")
	eol := payload[len(body):]
	out := c.takeParams(bytes.TrimLeft(body, " "))
	if bytes.Equal(out, bytes.TrimLeft(body, " ")) {
		return l
	}
	return append(append([]byte("data: "), out...), eol...)
}

// takeParams returns a JSON object without its kv_transfer_params object,
// which it keeps; anything else (not an object, no params, null params)
// comes back unchanged.
func (c *kvCapture) takeParams(b []byte) []byte {
	o, err := parseObject(b)
	if err != nil {
		return b
	}
	kv := bytes.TrimSpace(o.getFolded(kvParamsKey))
	if len(kv) == 0 || kv[0] != '{' {
		return b
	}
	c.params = append(json.RawMessage(nil), kv...)
	o.setFolded(kvParamsKey, nil)
	return o.marshal()
}

// answerChunk is what collect reads of an answer or a streamed chunk.
type answerChunk struct {
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Content *string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
}

// collect appends the text of choice 0 in a JSON answer or chunk to the
// answer, when the capture wants it. Anything it cannot read as one
// choice's text (another choice, a message without content) spoils it.
func (c *kvCapture) collect(b []byte) {
	if !c.wantAnswer || c.answerBad || len(b) == 0 || bytes.Equal(b, sseDone[len("data: "):]) {
		return
	}
	var a answerChunk
	if json.Unmarshal(b, &a) != nil {
		c.answerBad = true
		return
	}
	for _, ch := range a.Choices {
		switch {
		case ch.Index != 0:
			c.answerBad = true
		case ch.Text != nil:
			c.answer = append(c.answer, *ch.Text...)
		case ch.Message != nil && ch.Message.Content != nil:
			c.answer = append(c.answer, *ch.Message.Content...)
		case ch.Message != nil:
			c.answerBad = true
		case ch.Delta != nil && ch.Delta.Content != nil:
			c.answer = append(c.answer, *ch.Delta.Content...)
		}
	}
	if len(c.answer) > maxCaptureBytes {
		c.answerBad = true
	}
}

// answerOK reports whether the answer's text was read whole.
func (c *kvCapture) answerOK() bool { return c.wantAnswer && !c.answerBad }
