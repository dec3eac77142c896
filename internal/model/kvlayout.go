package model

import (
	"fmt"
	"strings"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// KVLayout describes how a paged KV pool is laid out in memory. A block holds
// BlockSize token slots for every layer, K and V, contiguous across layers
// ("cross-layer blocks"), so one block is one contiguous range of
// BlockBytes() bytes — a single range to transfer between engines.
//
// Within a block the order is [layer][kv (0=K,1=V)][slot][kvHead*HeadDim],
// each element a DType value (F32 or BF16).
type KVLayout struct {
	BlockSize int
	Layers    int
	KVHeads   int
	HeadDim   int
	DType     tensor.DType
}

// TokenElems is the number of elements one token occupies for one layer
// and one of K or V.
func (l KVLayout) TokenElems() int { return l.KVHeads * l.HeadDim }

// BlockElems is the number of elements in one block.
func (l KVLayout) BlockElems() int { return l.Layers * 2 * l.BlockSize * l.TokenElems() }

// ElemBytes is the size of one element: 4 for F32, 2 for BF16.
func (l KVLayout) ElemBytes() int {
	if l.DType == tensor.F32 {
		return 4
	}
	return 2
}

// BlockBytes is the size of one block in bytes.
func (l KVLayout) BlockBytes() int { return l.ElemBytes() * l.BlockElems() }

// Offset returns the element index in the pool of the K (kv=0) or V (kv=1)
// row of the token in slot of block for layer.
func (l KVLayout) Offset(block, layer, kv, slot int) int {
	return block*l.BlockElems() + ((layer*2+kv)*l.BlockSize+slot)*l.TokenElems()
}

// ParseKVDType reads a --kv-cache-dtype value: "auto" (or empty) keeps the
// model's default (Model.KVDType), "bfloat16"/"bf16" and "float32"/"f32"
// pick one. The second result is false for "auto".
func ParseKVDType(s string) (tensor.DType, bool, error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return 0, false, nil
	case "bfloat16", "bf16":
		return tensor.BF16, true, nil
	case "float32", "f32", "fp32", "float":
		return tensor.F32, true, nil
	}
	return 0, false, fmt.Errorf("model: KV cache dtype %q is not supported (auto, bfloat16 or float32)", s)
}
