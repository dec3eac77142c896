// Package ggufspec builds GGUF files byte by byte, straight from the format
// specification (ggml's docs/gguf.md), for tests. It shares no code with
// package gguf, so a test that reads a file built here checks the reader
// against the specification rather than against our own writer.
//
// Every field is appended in the order the specification lists it, little
// endian; nothing is validated, so tests can also build broken files.
package ggufspec

import (
	"encoding/binary"
	"math"
)

// Value type codes (gguf_metadata_value_type).
const (
	TUint8   = 0
	TInt8    = 1
	TUint16  = 2
	TInt16   = 3
	TUint32  = 4
	TInt32   = 5
	TFloat32 = 6
	TBool    = 7
	TString  = 8
	TArray   = 9
	TUint64  = 10
	TInt64   = 11
	TFloat64 = 12
)

// Tensor type codes (ggml_type).
const (
	GF32  = 0
	GF16  = 1
	GQ4_0 = 2
	GQ4_1 = 3
	GQ8_0 = 8
	GQ4_K = 12
	GQ5_K = 13
	GQ6_K = 14
	GBF16 = 30
)

// Builder accumulates the bytes of a file.
type Builder struct {
	B []byte
}

// U8 appends one byte.
func (b *Builder) U8(x uint8) *Builder { b.B = append(b.B, x); return b }

// U32 appends a little-endian uint32.
func (b *Builder) U32(x uint32) *Builder { b.B = binary.LittleEndian.AppendUint32(b.B, x); return b }

// U64 appends a little-endian uint64.
func (b *Builder) U64(x uint64) *Builder { b.B = binary.LittleEndian.AppendUint64(b.B, x); return b }

// F32 appends a little-endian IEEE binary32.
func (b *Builder) F32(x float32) *Builder { return b.U32(math.Float32bits(x)) }

// Str appends a gguf_string_t: uint64 length, then the bytes.
func (b *Builder) Str(s string) *Builder { b.U64(uint64(len(s))); b.B = append(b.B, s...); return b }

// Header appends magic "GGUF", version, tensor_count and metadata_kv_count.
func (b *Builder) Header(version uint32, tensors, kvs uint64) *Builder {
	b.B = append(b.B, 'G', 'G', 'U', 'F')
	return b.U32(version).U64(tensors).U64(kvs)
}

// KVString appends a string pair.
func (b *Builder) KVString(key, v string) *Builder { return b.Str(key).U32(TString).Str(v) }

// KVU32 appends a uint32 pair.
func (b *Builder) KVU32(key string, v uint32) *Builder { return b.Str(key).U32(TUint32).U32(v) }

// KVI32 appends an int32 pair.
func (b *Builder) KVI32(key string, v int32) *Builder { return b.Str(key).U32(TInt32).U32(uint32(v)) }

// KVF32 appends a float32 pair.
func (b *Builder) KVF32(key string, v float32) *Builder { return b.Str(key).U32(TFloat32).F32(v) }

// KVBool appends a bool pair.
func (b *Builder) KVBool(key string, v bool) *Builder {
	x := uint8(0)
	if v {
		x = 1
	}
	return b.Str(key).U32(TBool).U8(x)
}

// KVStrings appends an array-of-strings pair.
func (b *Builder) KVStrings(key string, vs []string) *Builder {
	b.Str(key).U32(TArray).U32(TString).U64(uint64(len(vs)))
	for _, s := range vs {
		b.Str(s)
	}
	return b
}

// KVF32s appends an array-of-float32 pair.
func (b *Builder) KVF32s(key string, vs []float32) *Builder {
	b.Str(key).U32(TArray).U32(TFloat32).U64(uint64(len(vs)))
	for _, v := range vs {
		b.F32(v)
	}
	return b
}

// KVI32s appends an array-of-int32 pair.
func (b *Builder) KVI32s(key string, vs []int32) *Builder {
	b.Str(key).U32(TArray).U32(TInt32).U64(uint64(len(vs)))
	for _, v := range vs {
		b.U32(uint32(v))
	}
	return b
}

// TensorInfo appends a gguf_tensor_info_t: name, n_dimensions, dimensions
// (innermost first), type, offset into the data section.
func (b *Builder) TensorInfo(name string, typ uint32, dims []uint64, offset uint64) *Builder {
	b.Str(name).U32(uint32(len(dims)))
	for _, d := range dims {
		b.U64(d)
	}
	return b.U32(typ).U64(offset)
}

// Pad appends zero bytes up to the next multiple of align.
func (b *Builder) Pad(align int) *Builder {
	for len(b.B)%align != 0 {
		b.B = append(b.B, 0)
	}
	return b
}

// Raw appends bytes as they are.
func (b *Builder) Raw(p []byte) *Builder { b.B = append(b.B, p...); return b }

// F32s encodes float32s as little-endian bytes (F32 tensor data).
func F32s(xs []float32) []byte {
	out := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(x))
	}
	return out
}

// Q8_0 encodes values as Q8_0 blocks written out by hand from the
// specification of block_q8_0 (an f16 scale d = max|x|/127, then 32 int8
// q = round(x/d)). len(xs) must be a multiple of 32.
func Q8_0(xs []float32) []byte {
	var out []byte
	for i := 0; i < len(xs); i += 32 {
		var amax float32
		for _, x := range xs[i : i+32] {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		d := amax / 127
		h := f16bits(d)
		dd := f16value(h)
		out = binary.LittleEndian.AppendUint16(out, h)
		for _, x := range xs[i : i+32] {
			q := 0.0
			if dd != 0 {
				q = math.Round(float64(x / dd))
			}
			out = append(out, byte(int8(max(-127, min(127, q)))))
		}
	}
	return out
}

// f16bits rounds a (small, normal or zero) float32 to IEEE binary16 bits,
// nearest even.
func f16bits(f float32) uint16 {
	if f == 0 {
		return 0
	}
	exp := math.Floor(math.Log2(float64(f)))
	if exp < -14 {
		exp = -14 // subnormal range
	}
	mant := float64(f) / math.Pow(2, exp-10)
	m := math.RoundToEven(mant)
	if m >= 2048 {
		m /= 2
		exp++
	}
	if m < 1024 { // subnormal
		return uint16(m)
	}
	return uint16(int(exp+15)<<10) | uint16(int(m)-1024)
}

// f16value widens binary16 bits.
func f16value(h uint16) float32 {
	e := int(h>>10) & 31
	m := float64(h & 1023)
	if e == 0 {
		return float32(m * math.Pow(2, -24))
	}
	return float32((1024 + m) * math.Pow(2, float64(e-25)))
}
