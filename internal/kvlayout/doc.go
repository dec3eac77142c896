// Package kvlayout describes the geometry of a paged KV cache: how many
// token slots a block holds, how K and V of every layer sit inside it, and
// the element type (f32 or bf16). It is a leaf (standard library only) so
// that the packages that size, map, check and transfer the pool — kvcache,
// kvxfer, kvevents — need not link the model loader or the kernels, while
// the model reads and writes the same layout in Forward.
//
// With hybrid KV-cache groups (Grouped: layers grouped by attention type,
// after vLLM's uniform-page-size grouping) a block is a page holding the K
// and V of one group's layers (Layout.Layers slots), every group's pages of
// the same byte size in one pool, and each group has its own block table;
// a model with one attention type is one group of every layer, the layout
// it always had.
package kvlayout
