// Package kvlayout describes the geometry of a paged KV cache: how many
// token slots a block holds, how K and V of every layer sit inside it, and
// the element type (f32 or bf16). It is a leaf (standard library only) so
// that the packages that size, map, check and transfer the pool — kvcache,
// kvxfer, kvevents — need not link the model loader or the kernels, while
// the model reads and writes the same layout in Forward.
package kvlayout
