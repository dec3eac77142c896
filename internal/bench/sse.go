package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxEventSize bounds one server-sent event's data, so a misbehaving server
// cannot make the client buffer without limit.
const MaxEventSize = 8 << 20

// SSEReader reads the data of server-sent events (the text/event-stream
// format) from a stream: "data:" lines are joined with newlines, a blank line
// ends an event, comment lines (":") and other fields are ignored. Lines may
// end in "\n", "\r\n" or "\r". An event cut off by the end of the stream is
// discarded, as the specification says.
type SSEReader struct {
	sc   *bufio.Scanner
	data bytes.Buffer
}

// NewSSEReader returns a reader of the events in r.
func NewSSEReader(r io.Reader) *SSEReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxEventSize)
	sc.Split(scanLines)
	return &SSEReader{sc: sc}
}

// ErrEventTooLarge is returned for an event larger than MaxEventSize.
var ErrEventTooLarge = fmt.Errorf("server-sent event larger than %d bytes", MaxEventSize)

// Next returns the data of the next event that has any "data" field. It
// returns io.EOF at the end of the stream. The returned slice is valid until
// the next call.
func (r *SSEReader) Next() ([]byte, error) {
	r.data.Reset()
	hasData := false
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if len(line) == 0 {
			if hasData {
				return r.data.Bytes(), nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, found := bytes.Cut(line, []byte{':'})
		if !found {
			value = nil // a field name alone has an empty value
		}
		if string(field) != "data" {
			continue
		}
		value = bytes.TrimPrefix(value, []byte{' '})
		if hasData {
			r.data.WriteByte('\n')
		}
		if r.data.Len()+len(value) > MaxEventSize {
			return nil, ErrEventTooLarge
		}
		r.data.Write(value)
		hasData = true
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, ErrEventTooLarge
		}
		return nil, err
	}
	return nil, io.EOF
}

// scanLines splits at "\n", "\r\n" or a lone "\r".
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	for i, c := range data {
		switch c {
		case '\n':
			return i + 1, data[:i], nil
		case '\r':
			if i+1 < len(data) {
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			}
			if atEOF {
				return i + 1, data[:i], nil
			}
			return 0, nil, nil // need one more byte to tell "\r" from "\r\n"
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
