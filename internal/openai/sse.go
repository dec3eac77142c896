package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// SSEWriter writes a server-sent event stream in OpenAI's format: one
// "data: <json>\n\n" event per chunk, flushed at once, ended by
// "data: [DONE]\n\n". Each write gets its own deadline, so a client that
// stops reading cannot hold a stream (and the engine request behind it)
// forever, while a long stream is never cut as a whole.
type SSEWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

// NewSSEWriter returns a writer for w. writeTimeout bounds each event's
// write; 0 means no deadline.
func NewSSEWriter(w http.ResponseWriter, writeTimeout time.Duration) *SSEWriter {
	return &SSEWriter{w: w, rc: http.NewResponseController(w), timeout: writeTimeout}
}

// Start writes the response headers (status 200, text/event-stream) if they
// have not been written yet. The data methods call it.
func (s *SSEWriter) Start() error {
	if s.started {
		return nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	return s.flush()
}

// Started reports whether the headers have been written.
func (s *SSEWriter) Started() bool { return s.started }

// Data marshals v and writes it as one event.
func (s *SSEWriter) Data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("openai: encode stream chunk: %w", err)
	}
	return s.Raw(b)
}

// Raw writes payload, which must be one line of JSON, as one event.
func (s *SSEWriter) Raw(payload []byte) error {
	if err := s.Start(); err != nil {
		return err
	}
	buf := make([]byte, 0, len(payload)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, payload...)
	buf = append(buf, "\n\n"...)
	return s.write(buf)
}

// Error writes err as an error event ({"error": {...}}); the caller then
// ends the stream with Done.
func (s *SSEWriter) Error(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		e = NewError(http.StatusInternalServerError, "", "%v", err)
	}
	return s.Data(e.Body())
}

// Done writes the final "data: [DONE]" event.
func (s *SSEWriter) Done() error {
	if err := s.Start(); err != nil {
		return err
	}
	return s.write([]byte("data: [DONE]\n\n"))
}

func (s *SSEWriter) write(b []byte) error {
	if s.timeout > 0 {
		// Not every ResponseWriter supports deadlines (httptest's recorder
		// does not); a stream without them still works.
		if err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.flush()
}

func (s *SSEWriter) flush() error {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}
