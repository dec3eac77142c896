package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
)

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

// decoder reads the header with bounds checks.
type decoder struct {
	br      *bufio.Reader
	pos     int64 // bytes consumed
	size    int64 // the file size
	limit   int64 // bytes the header may use: min(size, MaxHeaderBytes)
	scratch []byte
	buf     [8]byte
}

// need fails unless n more header bytes are available.
func (d *decoder) need(n int64, what string) error {
	if n >= 0 && n <= d.limit-d.pos {
		return nil
	}
	if d.limit < d.size {
		return fmt.Errorf("gguf: %s at byte %d needs %d bytes, beyond the %d-byte header limit", what, d.pos, n, int64(MaxHeaderBytes))
	}
	return fmt.Errorf("gguf: file truncated: %s at byte %d needs %d bytes, only %d remain", what, d.pos, n, max(0, d.limit-d.pos))
}

func (d *decoder) read(p []byte, what string) error {
	if err := d.need(int64(len(p)), what); err != nil {
		return err
	}
	if _, err := io.ReadFull(d.br, p); err != nil {
		return fmt.Errorf("gguf: reading %s at byte %d: %w", what, d.pos, err)
	}
	d.pos += int64(len(p))
	return nil
}

func (d *decoder) u32(what string) (uint32, error) {
	if err := d.read(d.buf[:4], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(d.buf[:4]), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	if err := d.read(d.buf[:8], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(d.buf[:8]), nil
}

// str reads a length-prefixed string of at most maxLen bytes.
func (d *decoder) str(maxLen int64, what string) (string, error) {
	n, err := d.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(maxLen) {
		return "", fmt.Errorf("gguf: %s at byte %d is %d bytes long, more than the limit of %d", what, d.pos-8, n, maxLen)
	}
	if err := d.need(int64(n), what); err != nil {
		return "", err
	}
	if uint64(cap(d.scratch)) < n {
		d.scratch = make([]byte, n)
	}
	b := d.scratch[:n]
	if err := d.read(b, what); err != nil {
		return "", err
	}
	return string(b), nil
}

func (d *decoder) file() (*File, error) {
	var magic [4]byte
	if err := d.read(magic[:], "magic"); err != nil {
		return nil, fmt.Errorf("%w (not a GGUF file)", err)
	}
	if string(magic[:]) != Magic {
		return nil, fmt.Errorf("gguf: not a GGUF file: starts with %q, want %q", magic[:], Magic)
	}
	version, err := d.u32("version")
	if err != nil {
		return nil, err
	}
	switch version {
	case 2, 3:
	case 1:
		return nil, errors.New("gguf: version 1 files (32-bit counts, from 2023) are not supported: convert the model again with a current llama.cpp")
	default:
		if v := bits.ReverseBytes32(version); v == 2 || v == 3 {
			return nil, fmt.Errorf("gguf: big-endian GGUF (version %d) is not supported", v)
		}
		return nil, fmt.Errorf("gguf: unknown version %d (supported: 2 and 3)", version)
	}
	nTensors, err := d.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64("metadata count")
	if err != nil {
		return nil, err
	}
	// The smallest key-value pair is 14 bytes (length, a 1-byte key,
	// type, a 1-byte value); the smallest tensor info 33 (a 1-byte name,
	// one dimension).
	const minKV, minInfo = 14, 33
	left := uint64(d.limit - d.pos)
	if nKV > left/minKV {
		return nil, fmt.Errorf("gguf: header claims %d metadata pairs, but the %d bytes that follow hold at most %d", nKV, left, left/minKV)
	}
	if nTensors > left/minInfo {
		return nil, fmt.Errorf("gguf: header claims %d tensors, but the %d bytes that follow hold at most %d tensor infos", nTensors, left, left/minInfo)
	}
	f := &File{Version: version, Size: d.size, Alignment: DefaultAlignment,
		KV: make([]KV, 0, nKV), keys: make(map[string]int, nKV)}
	for i := range nKV {
		key, err := d.str(MaxKeyLen, fmt.Sprintf("key of metadata pair %d", i))
		if err != nil {
			return nil, err
		}
		if key == "" {
			return nil, fmt.Errorf("gguf: metadata pair %d has an empty key", i)
		}
		if _, dup := f.keys[key]; dup {
			return nil, fmt.Errorf("gguf: metadata key %q appears twice", key)
		}
		t, err := d.u32(fmt.Sprintf("type of key %q", key))
		if err != nil {
			return nil, err
		}
		v, err := d.value(ValueType(t), key)
		if err != nil {
			return nil, err
		}
		f.keys[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	if v, ok := f.Get("general.alignment"); ok {
		a, isU32 := v.bits, v.typ == Uint32
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("gguf: general.alignment must be a uint32 power of two, found %s %s", v.typ, v)
		}
		f.Alignment = int64(a)
	}
	if err := d.tensorInfos(f, nTensors); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *decoder) value(t ValueType, key string) (Value, error) {
	switch t {
	case String:
		s, err := d.str(MaxStringLen, fmt.Sprintf("value of key %q", key))
		return Value{typ: String, str: s}, err
	case Array:
		return d.array(key)
	}
	n := t.size()
	if n <= 0 {
		return Value{}, fmt.Errorf("gguf: key %q has unknown value type %d", key, uint32(t))
	}
	if err := d.read(d.buf[:n], fmt.Sprintf("value of key %q", key)); err != nil {
		return Value{}, err
	}
	v := Value{typ: t, bits: scalarBits(t, d.buf[:n])}
	if t == Bool && v.bits > 1 {
		return Value{}, fmt.Errorf("gguf: key %q: bool value %d is neither 0 nor 1", key, v.bits)
	}
	return v, nil
}

// scalarBits decodes a little-endian scalar of type t, sign-extending
// signed integers.
func scalarBits(t ValueType, b []byte) uint64 {
	switch t {
	case Uint8, Bool:
		return uint64(b[0])
	case Int8:
		return uint64(int64(int8(b[0])))
	case Uint16:
		return uint64(binary.LittleEndian.Uint16(b))
	case Int16:
		return uint64(int64(int16(binary.LittleEndian.Uint16(b))))
	case Uint32, Float32:
		return uint64(binary.LittleEndian.Uint32(b))
	case Int32:
		return uint64(int64(int32(binary.LittleEndian.Uint32(b))))
	}
	return binary.LittleEndian.Uint64(b)
}

func (d *decoder) array(key string) (Value, error) {
	et, err := d.u32(fmt.Sprintf("element type of key %q", key))
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	n, err := d.u64(fmt.Sprintf("length of key %q", key))
	if err != nil {
		return Value{}, err
	}
	if elem == Array {
		return Value{}, fmt.Errorf("gguf: key %q is an array of arrays, which is not supported", key)
	}
	size := elem.size()
	if size < 0 {
		return Value{}, fmt.Errorf("gguf: key %q is an array of unknown value type %d", key, et)
	}
	if n > MaxArrayLen {
		return Value{}, fmt.Errorf("gguf: key %q is an array of %d elements, more than the limit of %d", key, n, MaxArrayLen)
	}
	minSize := int64(size)
	if elem == String {
		minSize = 8 // each string's length
	}
	what := fmt.Sprintf("array of key %q (%d × %s)", key, n, elem)
	if err := d.need(int64(n)*minSize, what); err != nil {
		return Value{}, err
	}
	v := Value{typ: Array, elem: elem}
	switch elem {
	case String:
		xs := make([]string, n)
		for i := range xs {
			if xs[i], err = d.str(MaxStringLen, fmt.Sprintf("element %d of key %q", i, key)); err != nil {
				return Value{}, err
			}
		}
		v.arr = xs
	case Uint8:
		v.arr, err = readArray(d, int(n), 1, what, func(b []byte) uint8 { return b[0] })
	case Int8:
		v.arr, err = readArray(d, int(n), 1, what, func(b []byte) int8 { return int8(b[0]) })
	case Bool:
		var xs []bool
		bad := false
		xs, err = readArray(d, int(n), 1, what, func(b []byte) bool { bad = bad || b[0] > 1; return b[0] != 0 })
		if err == nil && bad {
			return Value{}, fmt.Errorf("gguf: key %q: a bool element is neither 0 nor 1", key)
		}
		v.arr = xs
	case Uint16:
		v.arr, err = readArray(d, int(n), 2, what, binary.LittleEndian.Uint16)
	case Int16:
		v.arr, err = readArray(d, int(n), 2, what, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })
	case Uint32:
		v.arr, err = readArray(d, int(n), 4, what, binary.LittleEndian.Uint32)
	case Int32:
		v.arr, err = readArray(d, int(n), 4, what, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })
	case Float32:
		v.arr, err = readArray(d, int(n), 4, what, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })
	case Uint64:
		v.arr, err = readArray(d, int(n), 8, what, binary.LittleEndian.Uint64)
	case Int64:
		v.arr, err = readArray(d, int(n), 8, what, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })
	case Float64:
		v.arr, err = readArray(d, int(n), 8, what, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })
	}
	if err != nil {
		return Value{}, err
	}
	return v, nil
}

// readArray reads n little-endian elements of size bytes each (the caller
// checked that they are there).
func readArray[T any](d *decoder, n, size int, what string, conv func([]byte) T) ([]T, error) {
	out := make([]T, n)
	var chunk [4096]byte
	per := len(chunk) / size
	for i := 0; i < n; i += per {
		k := min(per, n-i)
		b := chunk[:k*size]
		if err := d.read(b, what); err != nil {
			return nil, err
		}
		for j := range k {
			out[i+j] = conv(b[j*size:])
		}
	}
	return out, nil
}

func alignUp(x, a int64) int64 { return x + (a-x%a)%a }

func (d *decoder) tensorInfos(f *File, n uint64) error {
	f.Tensors = make([]TensorInfo, 0, n)
	f.names = make(map[string]int, n)
	for i := range n {
		name, err := d.str(MaxNameLen, fmt.Sprintf("name of tensor %d", i))
		if err != nil {
			return err
		}
		if name == "" {
			return fmt.Errorf("gguf: tensor %d has an empty name", i)
		}
		if _, dup := f.names[name]; dup {
			return fmt.Errorf("gguf: tensor name %q appears twice", name)
		}
		nd, err := d.u32(fmt.Sprintf("dimension count of tensor %q", name))
		if err != nil {
			return err
		}
		if nd == 0 || nd > MaxDims {
			return fmt.Errorf("gguf: tensor %q has %d dimensions (want 1 to %d)", name, nd, MaxDims)
		}
		t := TensorInfo{Name: name, Dims: make([]int64, nd)}
		elems := uint64(1)
		for j := range t.Dims {
			x, err := d.u64(fmt.Sprintf("dimension %d of tensor %q", j, name))
			if err != nil {
				return err
			}
			hi, lo := bits.Mul64(elems, x)
			if x > math.MaxInt64 || hi != 0 || lo > math.MaxInt64 {
				return fmt.Errorf("gguf: tensor %q: dimensions overflow (dimension %d is %d)", name, j, x)
			}
			elems = lo
			t.Dims[j] = int64(x)
		}
		typ, err := d.u32(fmt.Sprintf("type of tensor %q", name))
		if err != nil {
			return err
		}
		t.Type = Type(typ)
		if t.Size, err = tensorSize(name, t.Type, t.Dims); err != nil {
			return err
		}
		off, err := d.u64(fmt.Sprintf("offset of tensor %q", name))
		if err != nil {
			return err
		}
		if off > math.MaxInt64 || int64(off)%f.Alignment != 0 {
			return fmt.Errorf("gguf: tensor %q: data offset %d is not a multiple of the alignment %d", name, off, f.Alignment)
		}
		t.Offset = int64(off)
		f.names[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	f.DataOffset = alignUp(d.pos, f.Alignment)
	if len(f.Tensors) == 0 {
		return nil
	}
	if f.DataOffset > d.size {
		return fmt.Errorf("gguf: file truncated: the data section would start at byte %d of a %d-byte file", f.DataOffset, d.size)
	}
	data := d.size - f.DataOffset
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
		t := &f.Tensors[i]
		if t.Offset > data || t.Size > data-t.Offset {
			return fmt.Errorf("gguf: tensor %q: %d bytes at data offset %d run past the end of the %d-byte data section (file truncated or offset wrong)", t.Name, t.Size, t.Offset, data)
		}
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	var prev *TensorInfo
	for _, i := range order {
		t := &f.Tensors[i]
		if t.Size == 0 {
			continue
		}
		if prev != nil && prev.Offset+prev.Size > t.Offset {
			return fmt.Errorf("gguf: tensors %q (data bytes %d..%d) and %q (from %d) overlap", prev.Name, prev.Offset, prev.Offset+prev.Size, t.Name, t.Offset)
		}
		prev = t
	}
	return nil
}

// tensorSize returns the data size of a tensor of type t and dimensions
// dims (whose product is known not to overflow).
func tensorSize(name string, t Type, dims []int64) (int64, error) {
	if !t.Supported() {
		return 0, unsupportedType(name, t)
	}
	elems, blockBytes := t.BlockSize()
	if dims[0]%int64(elems) != 0 {
		return 0, fmt.Errorf("gguf: tensor %q: first dimension %d is not a multiple of the %d-element %s block", name, dims[0], elems, t)
	}
	size := int64(blockBytes)
	for _, x := range append([]int64{dims[0] / int64(elems)}, dims[1:]...) {
		hi, lo := bits.Mul64(uint64(size), uint64(x))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("gguf: tensor %q: byte size overflows", name)
		}
		size = int64(lo)
	}
	return size, nil
}
