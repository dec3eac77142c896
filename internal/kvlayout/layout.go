package kvlayout

// Layout describes how a paged KV pool is laid out in memory. A block holds
// BlockSize token slots for every layer, K and V, contiguous across layers
// ("cross-layer blocks"), so one block is one contiguous range of
// BlockBytes() bytes — a single range to transfer between engines.
//
// Within a block the order is [layer][kv (0=K,1=V)][slot][kvHead*HeadDim],
// each element a DType value (F32 or BF16).
type Layout struct {
	BlockSize int
	Layers    int
	KVHeads   int
	HeadDim   int
	DType     ElemType
}

// TokenElems is the number of elements one token occupies for one layer
// and one of K or V.
func (l Layout) TokenElems() int { return l.KVHeads * l.HeadDim }

// BlockElems is the number of elements in one block.
func (l Layout) BlockElems() int { return l.Layers * 2 * l.BlockSize * l.TokenElems() }

// ElemBytes is the size of one element: 4 for F32, 2 for BF16.
func (l Layout) ElemBytes() int { return l.DType.Size() }

// BlockBytes is the size of one block in bytes.
func (l Layout) BlockBytes() int { return l.ElemBytes() * l.BlockElems() }

// Offset returns the element index in the pool of the K (kv=0) or V (kv=1)
// row of the token in slot of block for layer.
func (l Layout) Offset(block, layer, kv, slot int) int {
	return block*l.BlockElems() + ((layer*2+kv)*l.BlockSize+slot)*l.TokenElems()
}
