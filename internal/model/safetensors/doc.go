// Package safetensors reads and writes the safetensors tensor file format:
// an 8-byte little-endian header length N, N bytes of JSON mapping tensor
// names to {dtype, shape, data_offsets} (plus an optional "__metadata__"
// object of strings), then the raw little-endian tensor bytes, with
// data_offsets relative to the end of the header.
//
// Files are memory-mapped read-only, so opening a multi-gigabyte checkpoint
// costs a header parse and tensors alias the mapping without copies. Every
// offset, size and shape in the header is validated before any slicing: a
// corrupt or hostile file yields an error, never an out-of-range panic.
// Sharded checkpoints (model.safetensors.index.json with a weight_map) open
// as one Set.
package safetensors
