package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// Writer streams a safetensors file: the header is written up front from
// the declared tensors, then each tensor's bytes in declaration order, so a
// multi-gigabyte file never has to be held in memory.
type Writer struct {
	w       io.Writer
	tensors []Info
	next    int
	written int64
}

// NewWriter writes the header for tensors (laid out back to back in the
// given order) and metadata to w and returns a Writer expecting their data.
func NewWriter(w io.Writer, tensors []Info, metadata map[string]string) (*Writer, error) {
	hdr := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	laid := make([]Info, len(tensors))
	var off int64
	for i, t := range tensors {
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if _, dup := hdr[t.Name]; dup || t.Name == "__metadata__" {
			return nil, fmt.Errorf("safetensors: tensor name %q used twice", t.Name)
		}
		t.Begin = off
		t.End = off + t.Elements()*int64(t.DType.Size())
		off = t.End
		laid[i] = t
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = map[string]any{"dtype": t.DType, "shape": shape, "data_offsets": []int64{t.Begin, t.End}}
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("safetensors: encoding header: %w", err)
	}
	// Pad with spaces so the data section starts 8-byte aligned, which lets
	// readers alias f32 and 16-bit tensors without copying.
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, bytes.Repeat([]byte{' '}, pad)...)
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return nil, fmt.Errorf("safetensors: writing header: %w", err)
	}
	if _, err := w.Write(js); err != nil {
		return nil, fmt.Errorf("safetensors: writing header: %w", err)
	}
	return &Writer{w: w, tensors: laid}, nil
}

// Write appends raw bytes of the current tensor; a tensor's data may be
// written in several calls, and Write moves on to the next tensor once the
// current one is complete.
func (w *Writer) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		if w.next >= len(w.tensors) {
			return total, fmt.Errorf("safetensors: %d bytes written past the last tensor", len(p))
		}
		t := w.tensors[w.next]
		room := t.End - t.Begin - w.written
		chunk := p
		if int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		n, err := w.w.Write(chunk)
		total += n
		w.written += int64(n)
		if err != nil {
			return total, fmt.Errorf("safetensors: writing tensor %q: %w", t.Name, err)
		}
		p = p[n:]
		if w.written == t.End-t.Begin {
			w.next++
			w.written = 0
		}
	}
	// Skip over empty tensors so Close sees them as done.
	for w.next < len(w.tensors) && w.tensors[w.next].End == w.tensors[w.next].Begin {
		w.next++
	}
	return total, nil
}

// Close checks that every declared tensor was written in full. It does not
// close the underlying writer.
func (w *Writer) Close() error {
	for w.next < len(w.tensors) && w.tensors[w.next].End == w.tensors[w.next].Begin {
		w.next++
	}
	if w.next < len(w.tensors) {
		t := w.tensors[w.next]
		return fmt.Errorf("safetensors: tensor %q has %d of %d bytes written", t.Name, w.written, t.End-t.Begin)
	}
	return nil
}
