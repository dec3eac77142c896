package kvevents

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// The msgpack glue between msgp's runtime and the schema: the few places
// where msgspec's choices differ from msgp's defaults (non-negative
// integers as unsigned, None for an empty string) on the way out, and on
// the way in a reader that checks collection lengths against the bytes
// left before anything is allocated, bounds nesting, and reads integers,
// strings and floats in every form another encoder may choose.

// appendArrayLen writes an array header (msgpack's lengths are 32-bit;
// nothing Tandem encodes comes near).
func appendArrayLen(dst []byte, n int) []byte {
	return msgp.AppendArrayHeader(dst, uint32(n))
}

// appendInt writes v as msgspec does: non-negative values as unsigned (msgp
// writes them signed), the rest in the smallest signed form.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

// appendOptStr writes s, or nil (None) for "".
func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}

// maxDepth bounds the nesting of values the reader skips (unknown fields).
const maxDepth = 32

// reader reads msgpack values from b, from off on. It moves an offset
// rather than re-slicing b: a decoder's reader lives on the heap (closures
// capture it), where storing a slice costs a GC write barrier per value.
type reader struct {
	b   []byte
	off int
}

// left is what remains to read.
func (r *reader) left() []byte { return r.b[r.off:] }

// to moves past what msgp read: rest is the tail of left() it returned.
func (r *reader) to(rest []byte) { r.off = len(r.b) - len(rest) }

// count checks a collection length against the bytes left: every element
// takes at least min bytes.
func (r *reader) count(n uint32, min int) (int, error) {
	if left := len(r.b) - r.off; uint64(n) > uint64(left)/uint64(min) {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, left)
	}
	return int(n), nil
}

func (r *reader) arrayLen() (int, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(r.left())
	if err != nil {
		return 0, err
	}
	r.to(rest)
	return r.count(n, 1)
}

// mapOrArray reads the header of a map or an array.
func (r *reader) mapOrArray() (n int, isMap bool, err error) {
	if msgp.NextType(r.left()) != msgp.MapType {
		n, err = r.arrayLen()
		return n, false, err
	}
	m, rest, err := msgp.ReadMapHeaderBytes(r.left())
	if err != nil {
		return 0, true, err
	}
	r.to(rest)
	n, err = r.count(m, 2)
	return n, true, err
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	if msgp.IsNil(r.left()) {
		r.off++
		return true
	}
	return false
}

// int reads any msgpack integer that fits an int64, or a uint64 above it
// as its two's complement (for hashes).
func (r *reader) int() (int64, error) {
	v, rest, err := msgp.ReadInt64Bytes(r.left())
	if err == nil {
		r.to(rest)
		return v, nil
	}
	if _, ok := errors.AsType[msgp.UintOverflow](err); !ok {
		return 0, err
	}
	u, err := r.uint()
	return int64(u), err
}

// uint reads a non-negative msgpack integer.
func (r *reader) uint() (uint64, error) {
	u, rest, err := msgp.ReadUint64Bytes(r.left())
	if err != nil {
		return 0, err
	}
	r.to(rest)
	return u, nil
}

// float reads a float64, a float32 or an integer.
func (r *reader) float() (float64, error) {
	switch msgp.NextType(r.left()) {
	case msgp.Float64Type, msgp.Float32Type:
		f, rest, err := msgp.ReadFloat64Bytes(r.left())
		if err != nil {
			return 0, err
		}
		r.to(rest)
		return f, nil
	}
	v, err := r.int()
	return float64(v), err
}

// raw reads a str or bin value's bytes (not copied).
func (r *reader) raw() ([]byte, error) {
	p, rest, err := msgp.ReadMapKeyZC(r.left()) // a str, or a bin
	if err != nil {
		return nil, err
	}
	r.to(rest)
	return p, nil
}

func (r *reader) optStr() (string, error) {
	if r.isNil() {
		return "", nil
	}
	p, err := r.raw()
	return string(p), err
}

// skip skips one value of any type, nested at most maxDepth deep.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nesting too deep")
	}
	switch msgp.NextType(r.left()) {
	case msgp.MapType, msgp.ArrayType:
		n, isMap, err := r.mapOrArray()
		if err != nil {
			return err
		}
		if isMap {
			n *= 2
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	rest, err := msgp.Skip(r.left())
	if err != nil {
		return err
	}
	r.to(rest)
	return nil
}
