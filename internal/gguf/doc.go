// Package gguf reads and writes GGUF files, the single-file model format of
// llama.cpp and ggml (versions 2 and 3, little-endian).
//
// A GGUF file is a header (magic "GGUF", version, tensor and key-value
// counts), typed metadata key-value pairs, one info record per tensor
// (name, up to 4 dimensions, ggml type, offset into the data section), zero
// padding to the file's alignment (metadata key general.alignment, 32 when
// absent), then the data section holding every tensor at an aligned offset.
// Dimensions are listed innermost first, as ggml does: a weight matrix of
// Rows×Cols in Hugging Face layout has dimensions [Cols, Rows].
//
// Read parses and validates the header of a file without reading its
// tensor data. It treats the file as hostile: every count is checked against
// the bytes that remain before anything is allocated, strings and arrays are
// bounded (MaxStringLen, MaxArrayLen, MaxHeaderBytes), keys and tensor names
// must be unique, tensors have 1 to 4 dimensions whose product does not
// overflow, each tensor's size follows exactly from its shape and type and
// lies within the data section at an aligned offset, and no two tensors
// overlap. A file that fails any check gets an error saying what and where;
// Read never panics on any input (FuzzRead checks that).
//
// Tensor types F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K are
// supported; their blocks are ggml's, which internal/tensor's dtypes of the
// same names share, so tensor data is used as it is, without conversion. A
// tensor of any other ggml type is an error naming the tensor and its type.
//
// The package imports only the standard library, so that programs that
// read a GGUF tokenizer (the router) do not link the kernels.
//
// Writer writes a file from metadata and tensor infos, streaming the tensor
// data, so that a converted model never has to be held in memory whole.
//
// The package reads no tensor data itself beyond what File.ReadTensor is
// asked for: loading weights into memory (and undoing llama.cpp's Q/K row
// permutation) is the model package's job.
package gguf
