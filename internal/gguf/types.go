package gguf

import "fmt"

// Type is a ggml tensor type, as a tensor info records it.
type Type uint32

// The ggml tensor types this package reads and writes. Their numeric values
// are ggml's.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q5_0 Type = 6
	Q8_0 Type = 8
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	BF16 Type = 30
)

// typeNames names every ggml type, so that an error about an unsupported
// one can say which it is.
var typeNames = map[Type]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_2", 5: "Q4_3", 6: "Q5_0", 7: "Q5_1",
	8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
	15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
	21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64",
	28: "F64", 29: "IQ1_M", 30: "BF16", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
	34: "TQ1_0", 35: "TQ2_0", 36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8", 39: "MXFP4",
}

// blockSizes are the supported types' blocks: weights per block and bytes
// per block (ggml's blck_size and type_size).
var blockSizes = map[Type][2]int{
	F32: {1, 4}, F16: {1, 2}, BF16: {1, 2}, Q8_0: {32, 34},
	Q4_0: {32, 18}, Q5_0: {32, 22}, Q4_K: {256, 144}, Q5_K: {256, 176}, Q6_K: {256, 210},
}

// String returns ggml's name of the type ("F32", "Q4_K", ...), or "type N"
// for a number ggml does not define.
func (t Type) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// Supported reports whether this package reads and writes tensors of
// type t.
func (t Type) Supported() bool {
	_, ok := blockSizes[t]
	return ok
}

// BlockSize returns how many weights one block of t holds and how many
// bytes it takes ((1, 4) for F32, (32, 34) for Q8_0, ...), or (0, 0) for an
// unsupported type. The layouts are ggml's, and tensor.DType's of the same
// name.
func (t Type) BlockSize() (elems, bytes int) {
	b := blockSizes[t]
	return b[0], b[1]
}

// Quantized reports whether t is a block-quantized type.
func (t Type) Quantized() bool {
	elems, _ := t.BlockSize()
	return elems > 1
}

// SupportedTypes lists the supported types, for messages.
const SupportedTypes = "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K"

// unsupportedType is the error for a tensor of a type this package cannot
// use.
func unsupportedType(name string, t Type) error {
	return fmt.Errorf("gguf: tensor %q has type %s (%d), which is not supported (supported: %s)", name, t, uint32(t), SupportedTypes)
}
