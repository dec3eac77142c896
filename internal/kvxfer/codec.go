package kvxfer

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
)

// The payload codec: the primitives every message is made of, appended by
// appendU16, appendU32, appendU64 and appendString and read back by
// decoder, which checks every length against the bytes that remain. The
// messages are in messages.go, the frame around them in wire.go.

// maxString bounds one length-prefixed string (u16 length).
const maxString = math.MaxUint16

// Payload encoding: little-endian integers, strings as u16 length + bytes,
// lists as u32 count + elements.

func appendU16(b []byte, v uint16) []byte { return binary.LittleEndian.AppendUint16(b, v) }
func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendString(b []byte, s string) []byte {
	if len(s) > maxString {
		s = s[:maxString]
	}
	b = appendU16(b, uint16(len(s)))
	return append(b, s...)
}

// decoder reads a payload. The first failure sticks: callers check err once
// at the end. Every list length is checked against the bytes that remain
// before anything is allocated, so decoding never allocates more than a small
// multiple of the payload size.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: payload too short for %s", errBadFrame, what)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail(what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u16(what string) uint16 {
	if v := d.take(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32(what string) uint32 {
	if v := d.take(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64(what string) uint64 {
	if v := d.take(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str(what string) string {
	n := d.u16(what)
	v := d.take(int(n), what)
	if d.err == nil && !utf8.Valid(v) {
		d.err = fmt.Errorf("%w: %s is not valid UTF-8", errBadFrame, what)
	}
	return string(v)
}

// count reads a list length and checks that count elements of elemSize bytes
// each can still be in the payload.
func (d *decoder) count(elemSize int, what string) int {
	n := d.u32(what)
	if d.err == nil && uint64(n)*uint64(elemSize) > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %s claims %d entries but only %d payload bytes remain", errBadFrame, what, n, len(d.b))
		return 0
	}
	return int(n)
}
