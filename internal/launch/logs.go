package launch

import (
	"bytes"
	"fmt"
	"io"
	"sync"
)

// output serializes the writes of all children onto one writer: a line
// relay writes each line in one Write, so lines never interleave mid-way.
type output struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.w.Write(p)
}

// logKeep is how many of a child's last lines are kept for error reports.
const logKeep = 20

// maxLine bounds a line held back while waiting for its newline.
const maxLine = 64 << 10

// lineRelay is an io.Writer that relays whole lines to out under a prefix,
// one Write per line, and keeps the last logKeep of them.
type lineRelay struct {
	prefix string
	out    io.Writer

	mu      sync.Mutex
	partial []byte
	last    []string
}

func newLineRelay(prefix string, out io.Writer) *lineRelay {
	return &lineRelay{prefix: prefix, out: out}
}

// Write relays every complete line in p; a trailing partial line waits for
// the rest (or for Flush), unless it grows past maxLine.
func (l *lineRelay) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.emit(bytes.TrimSuffix(l.partial[:i], []byte("\r")))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > maxLine {
		l.emit(l.partial)
		l.partial = nil
	}
	if len(l.partial) == 0 {
		l.partial = nil // let the backing array go
	}
	return len(p), nil
}

// Flush relays a final line that had no newline.
func (l *lineRelay) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.emit(l.partial)
		l.partial = nil
	}
}

func (l *lineRelay) emit(line []byte) {
	fmt.Fprintf(l.out, "[%s] %s\n", l.prefix, line)
	l.last = append(l.last, string(line))
	if len(l.last) > logKeep {
		l.last = append([]string(nil), l.last[len(l.last)-logKeep:]...)
	}
}

// Last returns the last lines relayed, oldest first.
func (l *lineRelay) Last() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.last...)
}
