package model

// KVLayout describes how a paged KV pool is laid out in memory. A block holds
// BlockSize token slots for every layer, K and V, contiguous across layers
// ("cross-layer blocks"), so one block is one contiguous range of
// BlockFloats() float32 values — a single range to transfer between engines.
//
// Within a block the order is [layer][kv (0=K,1=V)][slot][kvHead*HeadDim].
type KVLayout struct {
	BlockSize int
	Layers    int
	KVHeads   int
	HeadDim   int
}

// TokenFloats is the number of float32s one token occupies for one layer and
// one of K or V.
func (l KVLayout) TokenFloats() int { return l.KVHeads * l.HeadDim }

// BlockFloats is the number of float32s in one block.
func (l KVLayout) BlockFloats() int { return l.Layers * 2 * l.BlockSize * l.TokenFloats() }

// BlockBytes is the size of one block in bytes.
func (l KVLayout) BlockBytes() int { return 4 * l.BlockFloats() }

// Offset returns the index in the pool of the K (kv=0) or V (kv=1) row of the
// token in slot of block for layer.
func (l KVLayout) Offset(block, layer, kv, slot int) int {
	return block*l.BlockFloats() + ((layer*2+kv)*l.BlockSize+slot)*l.TokenFloats()
}
