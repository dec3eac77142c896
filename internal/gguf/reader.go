package gguf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// The File API: a parsed header (File, TensorInfo), Read and Open, and the
// lookups and data reads on a File. The header is decoded in decoder.go,
// the tensor infos in tensorinfo.go.

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// Limits Read enforces. Real files stay far below them: the largest
// metadata in use (a 256k-token vocabulary with its merges and an embedded
// tokenizer.json) is tens of MiB.
const (
	// DefaultAlignment is the data alignment of a file without
	// general.alignment.
	DefaultAlignment = 32
	// MaxDims is the most dimensions a tensor may have.
	MaxDims = 4
	// MaxNameLen is the longest tensor name in bytes (ggml's GGML_MAX_NAME
	// less the terminating zero).
	MaxNameLen = 63
	// MaxKeyLen is the longest metadata key in bytes.
	MaxKeyLen = 65535
	// MaxStringLen is the longest metadata string in bytes.
	MaxStringLen = 256 << 20
	// MaxArrayLen is the most elements a metadata array may have.
	MaxArrayLen = 1 << 26
	// MaxHeaderBytes bounds the header (metadata and tensor infos), and so
	// what Read allocates: at most a small multiple of it.
	MaxHeaderBytes = 1 << 30
)

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	Type Type
	// Dims are the dimensions innermost first (ggml's ne): a Rows×Cols
	// matrix has Dims [Cols, Rows].
	Dims []int64
	// Offset is where the tensor's data starts, relative to the data
	// section (File.DataOffset).
	Offset int64
	// Size is the tensor's data size in bytes, as its shape and type imply.
	Size int64
}

// Shape returns the dimensions outermost first (the row-major shape of
// Hugging Face and safetensors), as ints.
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(t.Dims)-1-i] = int(d)
	}
	return s
}

// Elements returns the number of elements.
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is the parsed header of a GGUF file. Read and Open validate it in
// full (see the package documentation); the fields must not be modified.
type File struct {
	// Version is the format version (2 or 3).
	Version uint32
	// Alignment is the data alignment (general.alignment, or 32).
	Alignment int64
	// KV holds the metadata in file order.
	KV []KV
	// Tensors holds the tensor infos in file order.
	Tensors []TensorInfo
	// DataOffset is the file offset of the data section.
	DataOffset int64
	// Size is the file size in bytes.
	Size int64
	// Path is the file's path when it was opened with Open.
	Path string

	r      io.ReaderAt
	closer io.Closer
	keys   map[string]int
	names  map[string]int
}

// Read parses and validates the GGUF header of the size bytes of r. It
// reads no tensor data; File.ReadTensor reads a tensor's bytes from r.
func Read(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("gguf: negative size %d", size)
	}
	d := &decoder{br: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10), size: size, limit: min(size, MaxHeaderBytes)}
	f, err := d.file()
	if err != nil {
		return nil, err
	}
	f.r = r
	return f, nil
}

// Open opens the GGUF file at path and parses its header (see Read). The
// file stays open for ReadTensor until Close.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if st.IsDir() {
		fh.Close()
		return nil, fmt.Errorf("gguf: %s is a directory, not a GGUF file", path)
	}
	f, err := Read(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Path, f.closer = path, fh
	return f, nil
}

// IsFile reports whether path is a regular file that starts with the GGUF
// magic.
func IsFile(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	var m [4]byte
	_, err = io.ReadFull(fh, m[:])
	return err == nil && string(m[:]) == Magic
}

// Close closes the file opened by Open.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	err := f.closer.Close()
	f.closer, f.r = nil, nil
	return err
}

// DataSize returns the size of the data section.
func (f *File) DataSize() int64 { return max(0, f.Size-f.DataOffset) }

// Get returns the value of a metadata key.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.keys[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// Tensor returns the info of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.names[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// ReadTensor reads the data of t (one of f.Tensors) into dst, which must be
// t.Size bytes long.
func (f *File) ReadTensor(t *TensorInfo, dst []byte) error {
	if int64(len(dst)) != t.Size {
		return fmt.Errorf("gguf: tensor %q is %d bytes, not %d", t.Name, t.Size, len(dst))
	}
	return f.ReadData(dst, t.Offset)
}

// ReadData reads len(dst) bytes of the data section from offset off.
func (f *File) ReadData(dst []byte, off int64) error {
	if f.r == nil {
		return errors.New("gguf: file is closed")
	}
	if off < 0 || int64(len(dst)) > f.DataSize()-off {
		return fmt.Errorf("gguf: reading %d bytes at data offset %d: outside the %d-byte data section", len(dst), off, f.DataSize())
	}
	if len(dst) == 0 {
		return nil
	}
	if _, err := f.r.ReadAt(dst, f.DataOffset+off); err != nil {
		return fmt.Errorf("gguf: reading %d bytes at data offset %d: %w", len(dst), off, err)
	}
	return nil
}

// Uint returns the non-negative integer value of key and whether the key is
// present; a value of another type is an error.
func (f *File) Uint(key string) (uint64, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false, nil
	}
	x, ok := v.Uint()
	if !ok {
		return 0, true, fmt.Errorf("gguf: key %q: expected a non-negative integer, found %s %s", key, v.typ, v)
	}
	return x, true, nil
}

// Float returns the floating-point value of key and whether it is present;
// a value of another type is an error.
func (f *File) Float(key string) (float64, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return 0, false, nil
	}
	x, ok := v.Float()
	if !ok {
		return 0, true, fmt.Errorf("gguf: key %q: expected a float, found %s %s", key, v.typ, v)
	}
	return x, true, nil
}

// Str returns the string value of key and whether it is present; a value of
// another type is an error.
func (f *File) Str(key string) (string, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return "", false, nil
	}
	s, ok := v.Str()
	if !ok {
		return "", true, fmt.Errorf("gguf: key %q: expected a string, found %s %s", key, v.typ, v)
	}
	return s, true, nil
}

// Bool returns the bool value of key and whether it is present; a value of
// another type is an error.
func (f *File) Bool(key string) (bool, bool, error) {
	v, ok := f.Get(key)
	if !ok {
		return false, false, nil
	}
	b, ok := v.Bool()
	if !ok {
		return false, true, fmt.Errorf("gguf: key %q: expected a bool, found %s %s", key, v.typ, v)
	}
	return b, true, nil
}
