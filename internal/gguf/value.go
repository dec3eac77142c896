package gguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ValueType is the type of a metadata value. The numeric values are the
// format's.
type ValueType uint32

// The metadata value types.
const (
	Uint8 ValueType = iota
	Int8
	Uint16
	Int16
	Uint32
	Int32
	Float32
	Bool
	String
	Array
	Uint64
	Int64
	Float64
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// String returns the type's name ("uint32", "string", ...).
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("value type %d", uint32(t))
}

// size returns the encoded size of a scalar of type t, 0 for strings and
// arrays, and -1 for an unknown type.
func (t ValueType) size() int {
	switch t {
	case Uint8, Int8, Bool:
		return 1
	case Uint16, Int16:
		return 2
	case Uint32, Int32, Float32:
		return 4
	case Uint64, Int64, Float64:
		return 8
	case String, Array:
		return 0
	}
	return -1
}

// Value is one metadata value: a scalar, a string, or an array of scalars or
// strings. The zero Value is the uint8 0.
type Value struct {
	typ  ValueType
	elem ValueType // arrays: the element type
	bits uint64    // scalars: the integer (sign-extended), bool or IEEE bits
	str  string
	arr  any // arrays: []uint8, []int8, ..., []string
}

// KV is one metadata key-value pair.
type KV struct {
	Key   string
	Value Value
}

// Scalar and string constructors.

// Uint8Value returns a uint8 value.
func Uint8Value(x uint8) Value { return Value{typ: Uint8, bits: uint64(x)} }

// Int8Value returns an int8 value.
func Int8Value(x int8) Value { return Value{typ: Int8, bits: uint64(int64(x))} }

// Uint16Value returns a uint16 value.
func Uint16Value(x uint16) Value { return Value{typ: Uint16, bits: uint64(x)} }

// Int16Value returns an int16 value.
func Int16Value(x int16) Value { return Value{typ: Int16, bits: uint64(int64(x))} }

// Uint32Value returns a uint32 value.
func Uint32Value(x uint32) Value { return Value{typ: Uint32, bits: uint64(x)} }

// Int32Value returns an int32 value.
func Int32Value(x int32) Value { return Value{typ: Int32, bits: uint64(int64(x))} }

// Uint64Value returns a uint64 value.
func Uint64Value(x uint64) Value { return Value{typ: Uint64, bits: x} }

// Int64Value returns an int64 value.
func Int64Value(x int64) Value { return Value{typ: Int64, bits: uint64(x)} }

// Float32Value returns a float32 value.
func Float32Value(x float32) Value { return Value{typ: Float32, bits: uint64(math.Float32bits(x))} }

// Float64Value returns a float64 value.
func Float64Value(x float64) Value { return Value{typ: Float64, bits: math.Float64bits(x)} }

// BoolValue returns a bool value.
func BoolValue(x bool) Value {
	v := Value{typ: Bool}
	if x {
		v.bits = 1
	}
	return v
}

// StringValue returns a string value.
func StringValue(s string) Value { return Value{typ: String, str: s} }

// Elem is the set of Go types an array value can hold.
type Elem interface {
	uint8 | int8 | uint16 | int16 | uint32 | int32 | float32 | bool | string | uint64 | int64 | float64
}

// ArrayValue returns an array value holding xs (not copied).
func ArrayValue[T Elem](xs []T) Value {
	return Value{typ: Array, elem: elemType(xs), arr: xs}
}

func elemType(xs any) ValueType {
	switch xs.(type) {
	case []uint8:
		return Uint8
	case []int8:
		return Int8
	case []uint16:
		return Uint16
	case []int16:
		return Int16
	case []uint32:
		return Uint32
	case []int32:
		return Int32
	case []float32:
		return Float32
	case []bool:
		return Bool
	case []string:
		return String
	case []uint64:
		return Uint64
	case []int64:
		return Int64
	case []float64:
		return Float64
	}
	panic(fmt.Sprintf("gguf: no array element type for %T", xs))
}

// ArrayOf returns the elements of an array value whose element type is T's
// exactly, and whether it is one. The slice is the value's own: do not
// modify it.
func ArrayOf[T Elem](v Value) ([]T, bool) {
	if v.typ != Array {
		return nil, false
	}
	xs, ok := v.arr.([]T)
	return xs, ok
}

// Type returns the value's type.
func (v Value) Type() ValueType { return v.typ }

// ElemType returns the element type of an array value.
func (v Value) ElemType() ValueType { return v.elem }

// Len returns the number of elements of an array value, 0 for other values.
func (v Value) Len() int {
	if v.typ != Array {
		return 0
	}
	switch xs := v.arr.(type) {
	case []uint8:
		return len(xs)
	case []int8:
		return len(xs)
	case []uint16:
		return len(xs)
	case []int16:
		return len(xs)
	case []uint32:
		return len(xs)
	case []int32:
		return len(xs)
	case []float32:
		return len(xs)
	case []bool:
		return len(xs)
	case []string:
		return len(xs)
	case []uint64:
		return len(xs)
	case []int64:
		return len(xs)
	case []float64:
		return len(xs)
	}
	return 0
}

func (v Value) signed() bool {
	return v.typ == Int8 || v.typ == Int16 || v.typ == Int32 || v.typ == Int64
}

func (v Value) unsigned() bool {
	return v.typ == Uint8 || v.typ == Uint16 || v.typ == Uint32 || v.typ == Uint64
}

// Uint returns an integer value that is not negative, of any integer type.
func (v Value) Uint() (uint64, bool) {
	switch {
	case v.unsigned():
		return v.bits, true
	case v.signed() && int64(v.bits) >= 0:
		return v.bits, true
	}
	return 0, false
}

// Int returns an integer value that fits an int64, of any integer type.
func (v Value) Int() (int64, bool) {
	switch {
	case v.signed():
		return int64(v.bits), true
	case v.unsigned() && v.bits <= math.MaxInt64:
		return int64(v.bits), true
	}
	return 0, false
}

// Float returns a float32 or float64 value.
func (v Value) Float() (float64, bool) {
	switch v.typ {
	case Float32:
		return float64(math.Float32frombits(uint32(v.bits))), true
	case Float64:
		return math.Float64frombits(v.bits), true
	}
	return 0, false
}

// Bool returns a bool value.
func (v Value) Bool() (bool, bool) { return v.bits != 0, v.typ == Bool }

// Str returns a string value.
func (v Value) Str() (string, bool) { return v.str, v.typ == String }

// String formats the value for people: scalars as Go formats them, strings
// quoted and cut at 60 bytes, arrays as their type, length and first few
// elements.
func (v Value) String() string {
	switch v.typ {
	case String:
		s := v.str
		if len(s) > 60 {
			return strconv.Quote(s[:60]) + fmt.Sprintf("... (%d bytes)", len(s))
		}
		return strconv.Quote(s)
	case Array:
		n := v.Len()
		var b strings.Builder
		fmt.Fprintf(&b, "[%d × %s]", n, v.elem)
		for i := range min(n, 4) {
			if i == 0 {
				b.WriteString(" ")
			} else {
				b.WriteString(", ")
			}
			b.WriteString(v.index(i).String())
		}
		if n > 4 {
			b.WriteString(", ...")
		}
		return b.String()
	case Float32, Float64:
		f, _ := v.Float()
		return strconv.FormatFloat(f, 'g', -1, 64)
	case Bool:
		return strconv.FormatBool(v.bits != 0)
	}
	if v.signed() {
		return strconv.FormatInt(int64(v.bits), 10)
	}
	return strconv.FormatUint(v.bits, 10)
}

// index returns element i of an array value as a Value.
func (v Value) index(i int) Value {
	switch xs := v.arr.(type) {
	case []uint8:
		return Uint8Value(xs[i])
	case []int8:
		return Int8Value(xs[i])
	case []uint16:
		return Uint16Value(xs[i])
	case []int16:
		return Int16Value(xs[i])
	case []uint32:
		return Uint32Value(xs[i])
	case []int32:
		return Int32Value(xs[i])
	case []float32:
		return Float32Value(xs[i])
	case []bool:
		return BoolValue(xs[i])
	case []string:
		return StringValue(xs[i])
	case []uint64:
		return Uint64Value(xs[i])
	case []int64:
		return Int64Value(xs[i])
	case []float64:
		return Float64Value(xs[i])
	}
	return Value{}
}
