package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
)

// The header decoder: decoder reads the header with every read bounded by
// the bytes that remain (and by MaxHeaderBytes) before anything is
// allocated; file decodes the magic, the version, the counts and the
// metadata key-value pairs (value, array), then the tensor infos
// (tensorinfo.go).

// decoder reads the header with bounds checks.
type decoder struct {
	br      *bufio.Reader
	pos     int64 // bytes consumed
	size    int64 // the file size
	limit   int64 // bytes the header may use: min(size, MaxHeaderBytes)
	scratch []byte
	buf     [8]byte
}

// need fails unless n more header bytes are available.
func (d *decoder) need(n int64, what string) error {
	if n >= 0 && n <= d.limit-d.pos {
		return nil
	}
	if d.limit < d.size {
		return fmt.Errorf("gguf: %s at byte %d needs %d bytes, beyond the %d-byte header limit", what, d.pos, n, int64(MaxHeaderBytes))
	}
	return fmt.Errorf("gguf: file truncated: %s at byte %d needs %d bytes, only %d remain", what, d.pos, n, max(0, d.limit-d.pos))
}

func (d *decoder) read(p []byte, what string) error {
	if err := d.need(int64(len(p)), what); err != nil {
		return err
	}
	if _, err := io.ReadFull(d.br, p); err != nil {
		return fmt.Errorf("gguf: reading %s at byte %d: %w", what, d.pos, err)
	}
	d.pos += int64(len(p))
	return nil
}

func (d *decoder) u32(what string) (uint32, error) {
	if err := d.read(d.buf[:4], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(d.buf[:4]), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	if err := d.read(d.buf[:8], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(d.buf[:8]), nil
}

// str reads a length-prefixed string of at most maxLen bytes.
func (d *decoder) str(maxLen int64, what string) (string, error) {
	n, err := d.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(maxLen) {
		return "", fmt.Errorf("gguf: %s at byte %d is %d bytes long, more than the limit of %d", what, d.pos-8, n, maxLen)
	}
	if err := d.need(int64(n), what); err != nil {
		return "", err
	}
	if uint64(cap(d.scratch)) < n {
		d.scratch = make([]byte, n)
	}
	b := d.scratch[:n]
	if err := d.read(b, what); err != nil {
		return "", err
	}
	return string(b), nil
}

func (d *decoder) file() (*File, error) {
	var magic [4]byte
	if err := d.read(magic[:], "magic"); err != nil {
		return nil, fmt.Errorf("%w (not a GGUF file)", err)
	}
	if string(magic[:]) != Magic {
		return nil, fmt.Errorf("gguf: not a GGUF file: starts with %q, want %q", magic[:], Magic)
	}
	version, err := d.u32("version")
	if err != nil {
		return nil, err
	}
	switch version {
	case 2, 3:
	case 1:
		return nil, errors.New("gguf: version 1 files (32-bit counts, from 2023) are not supported: convert the model again with a current llama.cpp")
	default:
		if v := bits.ReverseBytes32(version); v == 2 || v == 3 {
			return nil, fmt.Errorf("gguf: big-endian GGUF (version %d) is not supported", v)
		}
		return nil, fmt.Errorf("gguf: unknown version %d (supported: 2 and 3)", version)
	}
	nTensors, err := d.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64("metadata count")
	if err != nil {
		return nil, err
	}
	// The smallest key-value pair is 14 bytes (length, a 1-byte key,
	// type, a 1-byte value); the smallest tensor info 33 (a 1-byte name,
	// one dimension).
	const minKV, minInfo = 14, 33
	left := uint64(d.limit - d.pos)
	if nKV > left/minKV {
		return nil, fmt.Errorf("gguf: header claims %d metadata pairs, but the %d bytes that follow hold at most %d", nKV, left, left/minKV)
	}
	if nTensors > left/minInfo {
		return nil, fmt.Errorf("gguf: header claims %d tensors, but the %d bytes that follow hold at most %d tensor infos", nTensors, left, left/minInfo)
	}
	f := &File{Version: version, Size: d.size, Alignment: DefaultAlignment,
		KV: make([]KV, 0, nKV), keys: make(map[string]int, nKV)}
	for i := range nKV {
		key, err := d.str(MaxKeyLen, fmt.Sprintf("key of metadata pair %d", i))
		if err != nil {
			return nil, err
		}
		if key == "" {
			return nil, fmt.Errorf("gguf: metadata pair %d has an empty key", i)
		}
		if _, dup := f.keys[key]; dup {
			return nil, fmt.Errorf("gguf: metadata key %q appears twice", key)
		}
		t, err := d.u32(fmt.Sprintf("type of key %q", key))
		if err != nil {
			return nil, err
		}
		v, err := d.value(ValueType(t), key)
		if err != nil {
			return nil, err
		}
		f.keys[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	if v, ok := f.Get("general.alignment"); ok {
		a, isU32 := v.bits, v.typ == Uint32
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("gguf: general.alignment must be a uint32 power of two, found %s %s", v.typ, v)
		}
		f.Alignment = int64(a)
	}
	if err := d.tensorInfos(f, nTensors); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *decoder) value(t ValueType, key string) (Value, error) {
	switch t {
	case String:
		s, err := d.str(MaxStringLen, fmt.Sprintf("value of key %q", key))
		return Value{typ: String, str: s}, err
	case Array:
		return d.array(key)
	}
	n := t.size()
	if n <= 0 {
		return Value{}, fmt.Errorf("gguf: key %q has unknown value type %d", key, uint32(t))
	}
	if err := d.read(d.buf[:n], fmt.Sprintf("value of key %q", key)); err != nil {
		return Value{}, err
	}
	v := Value{typ: t, bits: scalarBits(t, d.buf[:n])}
	if t == Bool && v.bits > 1 {
		return Value{}, fmt.Errorf("gguf: key %q: bool value %d is neither 0 nor 1", key, v.bits)
	}
	return v, nil
}

// scalarBits decodes a little-endian scalar of type t, sign-extending
// signed integers.
func scalarBits(t ValueType, b []byte) uint64 {
	switch t {
	case Uint8, Bool:
		return uint64(b[0])
	case Int8:
		return uint64(int64(int8(b[0])))
	case Uint16:
		return uint64(binary.LittleEndian.Uint16(b))
	case Int16:
		return uint64(int64(int16(binary.LittleEndian.Uint16(b))))
	case Uint32, Float32:
		return uint64(binary.LittleEndian.Uint32(b))
	case Int32:
		return uint64(int64(int32(binary.LittleEndian.Uint32(b))))
	}
	return binary.LittleEndian.Uint64(b)
}

func (d *decoder) array(key string) (Value, error) {
	et, err := d.u32(fmt.Sprintf("element type of key %q", key))
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	n, err := d.u64(fmt.Sprintf("length of key %q", key))
	if err != nil {
		return Value{}, err
	}
	if elem == Array {
		return Value{}, fmt.Errorf("gguf: key %q is an array of arrays, which is not supported", key)
	}
	size := elem.size()
	if size < 0 {
		return Value{}, fmt.Errorf("gguf: key %q is an array of unknown value type %d", key, et)
	}
	if n > MaxArrayLen {
		return Value{}, fmt.Errorf("gguf: key %q is an array of %d elements, more than the limit of %d", key, n, MaxArrayLen)
	}
	minSize := int64(size)
	if elem == String {
		minSize = 8 // each string's length
	}
	what := fmt.Sprintf("array of key %q (%d × %s)", key, n, elem)
	if err := d.need(int64(n)*minSize, what); err != nil {
		return Value{}, err
	}
	v := Value{typ: Array, elem: elem}
	switch elem {
	case String:
		xs := make([]string, n)
		for i := range xs {
			if xs[i], err = d.str(MaxStringLen, fmt.Sprintf("element %d of key %q", i, key)); err != nil {
				return Value{}, err
			}
		}
		v.arr = xs
	case Uint8:
		v.arr, err = readArray(d, int(n), 1, what, func(b []byte) uint8 { return b[0] })
	case Int8:
		v.arr, err = readArray(d, int(n), 1, what, func(b []byte) int8 { return int8(b[0]) })
	case Bool:
		var xs []bool
		bad := false
		xs, err = readArray(d, int(n), 1, what, func(b []byte) bool { bad = bad || b[0] > 1; return b[0] != 0 })
		if err == nil && bad {
			return Value{}, fmt.Errorf("gguf: key %q: a bool element is neither 0 nor 1", key)
		}
		v.arr = xs
	case Uint16:
		v.arr, err = readArray(d, int(n), 2, what, binary.LittleEndian.Uint16)
	case Int16:
		v.arr, err = readArray(d, int(n), 2, what, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })
	case Uint32:
		v.arr, err = readArray(d, int(n), 4, what, binary.LittleEndian.Uint32)
	case Int32:
		v.arr, err = readArray(d, int(n), 4, what, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })
	case Float32:
		v.arr, err = readArray(d, int(n), 4, what, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })
	case Uint64:
		v.arr, err = readArray(d, int(n), 8, what, binary.LittleEndian.Uint64)
	case Int64:
		v.arr, err = readArray(d, int(n), 8, what, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })
	case Float64:
		v.arr, err = readArray(d, int(n), 8, what, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })
	}
	if err != nil {
		return Value{}, err
	}
	return v, nil
}

// readArray reads n little-endian elements of size bytes each (the caller
// checked that they are there).
func readArray[T any](d *decoder, n, size int, what string, conv func([]byte) T) ([]T, error) {
	out := make([]T, n)
	var chunk [4096]byte
	per := len(chunk) / size
	for i := 0; i < n; i += per {
		k := min(per, n-i)
		b := chunk[:k*size]
		if err := d.read(b, what); err != nil {
			return nil, err
		}
		for j := range k {
			out[i+j] = conv(b[j*size:])
		}
	}
	return out, nil
}
