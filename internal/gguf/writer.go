package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Writer streams a GGUF version 3 file: NewWriter writes the header,
// metadata and tensor infos, then the tensors' data is written in the order
// the infos were given, and Writer pads each tensor to the alignment.
type Writer struct {
	w       io.Writer
	tensors []TensorInfo
	align   int64
	next    int   // the tensor being written
	written int64 // bytes of it written so far
}

// NewWriter validates kv and tensors, writes the file's header to w and
// returns a Writer expecting the tensors' data. Each tensor's Name, Type and
// Dims must be set; NewWriter computes Offset and Size, laying the tensors
// out in the given order (Tensors returns them). The alignment is
// general.alignment if kv sets it (a uint32 power of two), else 32.
func NewWriter(w io.Writer, kv []KV, tensors []TensorInfo) (*Writer, error) {
	wr := &Writer{w: w, align: DefaultAlignment}
	seen := make(map[string]bool, len(kv))
	for _, p := range kv {
		if p.Key == "" || len(p.Key) > MaxKeyLen {
			return nil, fmt.Errorf("gguf: metadata key %q: must be 1 to %d bytes", p.Key, MaxKeyLen)
		}
		if seen[p.Key] {
			return nil, fmt.Errorf("gguf: metadata key %q given twice", p.Key)
		}
		seen[p.Key] = true
		if err := checkValue(p.Key, p.Value); err != nil {
			return nil, err
		}
		if p.Key == "general.alignment" {
			a := p.Value.bits
			if p.Value.typ != Uint32 || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("gguf: general.alignment must be a uint32 power of two, got %s %s", p.Value.typ, p.Value)
			}
			wr.align = int64(a)
		}
	}
	names := make(map[string]bool, len(tensors))
	var off int64
	for _, t := range tensors {
		if t.Name == "" || len(t.Name) > MaxNameLen {
			return nil, fmt.Errorf("gguf: tensor name %q: must be 1 to %d bytes", t.Name, MaxNameLen)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("gguf: tensor name %q given twice", t.Name)
		}
		names[t.Name] = true
		if len(t.Dims) == 0 || len(t.Dims) > MaxDims {
			return nil, fmt.Errorf("gguf: tensor %q has %d dimensions (want 1 to %d)", t.Name, len(t.Dims), MaxDims)
		}
		elems := int64(1)
		for _, d := range t.Dims {
			if d < 0 || d > 0 && elems > math.MaxInt64/d {
				return nil, fmt.Errorf("gguf: tensor %q: bad dimensions %v", t.Name, t.Dims)
			}
			elems *= d
		}
		size, err := tensorSize(t.Name, t.Type, t.Dims)
		if err != nil {
			return nil, err
		}
		t.Dims = append([]int64(nil), t.Dims...)
		t.Offset, t.Size = off, size
		off = alignUp(off+size, wr.align)
		wr.tensors = append(wr.tensors, t)
	}
	if err := wr.header(kv); err != nil {
		return nil, err
	}
	wr.skipEmpty()
	return wr, nil
}

func checkValue(key string, v Value) error {
	switch v.typ {
	case String:
		if len(v.str) > MaxStringLen {
			return fmt.Errorf("gguf: key %q: string of %d bytes is longer than %d", key, len(v.str), MaxStringLen)
		}
	case Array:
		if v.Len() > MaxArrayLen {
			return fmt.Errorf("gguf: key %q: array of %d elements is longer than %d", key, v.Len(), MaxArrayLen)
		}
		if xs, ok := v.arr.([]string); ok {
			for _, s := range xs {
				if len(s) > MaxStringLen {
					return fmt.Errorf("gguf: key %q: string of %d bytes is longer than %d", key, len(s), MaxStringLen)
				}
			}
		}
	default:
		if v.typ.size() <= 0 {
			return fmt.Errorf("gguf: key %q: unknown value type %d", key, uint32(v.typ))
		}
	}
	return nil
}

// Tensors returns the tensor infos with their offsets and sizes.
func (w *Writer) Tensors() []TensorInfo { return w.tensors }

// header writes everything up to the data section.
func (w *Writer) header(kv []KV) error {
	bw := bufio.NewWriterSize(w.w, 1<<20)
	e := &encoder{w: bw}
	e.bytes([]byte(Magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(kv)))
	for _, p := range kv {
		e.str(p.Key)
		e.u32(uint32(p.Value.typ))
		e.value(p.Value)
	}
	for _, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(uint64(d))
		}
		e.u32(uint32(t.Type))
		e.u64(uint64(t.Offset))
	}
	e.pad(w.align)
	if e.err == nil {
		e.err = bw.Flush()
	}
	if e.err != nil {
		return fmt.Errorf("gguf: writing header: %w", e.err)
	}
	return nil
}

// Write appends data of the current tensor; a tensor may be written in
// several calls, and Write moves on (after the padding) when it is
// complete.
func (w *Writer) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		if w.next >= len(w.tensors) {
			return total, fmt.Errorf("gguf: %d bytes written past the last tensor", len(p))
		}
		t := &w.tensors[w.next]
		chunk := p[:min(int64(len(p)), t.Size-w.written)]
		n, err := w.w.Write(chunk)
		total += n
		w.written += int64(n)
		if err != nil {
			return total, fmt.Errorf("gguf: writing tensor %q: %w", t.Name, err)
		}
		p = p[n:]
		if w.written == t.Size {
			if err := w.finish(); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// finish pads the completed tensor and moves to the next non-empty one.
func (w *Writer) finish() error {
	t := &w.tensors[w.next]
	if pad := alignUp(t.Size, w.align) - t.Size; pad > 0 {
		if _, err := w.w.Write(make([]byte, pad)); err != nil {
			return fmt.Errorf("gguf: writing padding after %q: %w", t.Name, err)
		}
	}
	w.next++
	w.written = 0
	w.skipEmpty()
	return nil
}

func (w *Writer) skipEmpty() {
	for w.next < len(w.tensors) && w.tensors[w.next].Size == 0 {
		w.next++
	}
}

// Close checks that every tensor was written in full. It does not close
// the underlying writer.
func (w *Writer) Close() error {
	if w.next < len(w.tensors) {
		t := w.tensors[w.next]
		return fmt.Errorf("gguf: tensor %q has %d of %d bytes written", t.Name, w.written, t.Size)
	}
	return nil
}

// encoder writes little-endian fields, remembering the first error.
type encoder struct {
	w   io.Writer
	n   int64
	err error
	buf [8]byte
}

func (e *encoder) bytes(b []byte) {
	if e.err != nil {
		return
	}
	var n int
	n, e.err = e.w.Write(b)
	e.n += int64(n)
}

func (e *encoder) u32(x uint32) {
	binary.LittleEndian.PutUint32(e.buf[:4], x)
	e.bytes(e.buf[:4])
}

func (e *encoder) u64(x uint64) {
	binary.LittleEndian.PutUint64(e.buf[:8], x)
	e.bytes(e.buf[:8])
}

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		var n int
		n, e.err = io.WriteString(e.w, s)
		e.n += int64(n)
	}
}

func (e *encoder) pad(align int64) {
	if p := alignUp(e.n, align) - e.n; p > 0 {
		e.bytes(make([]byte, p))
	}
}

func (e *encoder) scalar(t ValueType, bits uint64) {
	switch t.size() {
	case 1:
		e.bytes([]byte{byte(bits)})
	case 2:
		binary.LittleEndian.PutUint16(e.buf[:2], uint16(bits))
		e.bytes(e.buf[:2])
	case 4:
		e.u32(uint32(bits))
	case 8:
		e.u64(bits)
	}
}

func (e *encoder) value(v Value) {
	switch v.typ {
	case String:
		e.str(v.str)
	case Array:
		e.u32(uint32(v.elem))
		n := v.Len()
		e.u64(uint64(n))
		if xs, ok := v.arr.([]string); ok {
			for _, s := range xs {
				e.str(s)
			}
			return
		}
		for i := range n {
			e.scalar(v.elem, v.index(i).bits)
		}
	default:
		e.scalar(v.typ, v.bits)
	}
}
