package kvlayout

import (
	"fmt"
	"strconv"
	"strings"
)

// ElemType is the element type of a KV cache: F32 or BF16. The model maps
// it to the kernels' own element types; nothing here knows about them.
type ElemType uint8

// The KV element types. The numeric values are stable: the KV pool file
// records them in its header (internal/kvcache), and they equal the values
// the header held before this type existed (tensor.DType's F32 and BF16),
// so engines of either build read each other's pools.
const (
	F32  ElemType = 0 // IEEE 754 binary32
	BF16 ElemType = 1 // bfloat16: the top 16 bits of a binary32
)

// Valid reports whether e is F32 or BF16.
func (e ElemType) Valid() bool { return e == F32 || e == BF16 }

// Size is the size of one element in bytes: 4 for F32, 2 for anything else
// (BF16; an invalid type is refused where a pool is made, not here).
func (e ElemType) Size() int {
	if e == F32 {
		return 4
	}
	return 2
}

// String returns "f32" or "bf16" (the names the side channel's handshake
// carries and ParseElemType reads back), or "ElemType(n)" for any other
// value.
func (e ElemType) String() string {
	switch e {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	}
	return "ElemType(" + strconv.Itoa(int(e)) + ")"
}

// ParseElemType reads a --kv-cache-dtype value: "auto" (or empty) keeps the
// model's default, "bfloat16"/"bf16" and "float32"/"f32" pick one. The
// second result is false for "auto".
func ParseElemType(s string) (ElemType, bool, error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return 0, false, nil
	case "bfloat16", "bf16":
		return BF16, true, nil
	case "float32", "f32", "fp32", "float":
		return F32, true, nil
	}
	return 0, false, fmt.Errorf("kvlayout: KV cache dtype %q is not supported (auto, bfloat16 or float32)", s)
}
