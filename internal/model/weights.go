package model

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// nativeLittleEndian reports whether raw little-endian file bytes can be
// aliased as Go numbers. On a big-endian host every tensor is decoded into
// a copy instead.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// weight is one tensor of a checkpoint as the binder sees it.
type weight struct {
	// dtype is the tensor's element type; ok is false when the file's type
	// (typeName) has no tensor.DType.
	dtype tensor.DType
	ok    bool
	// typeName is the type as the file names it ("BF16", "Q8_0").
	typeName string
	shape    []int
	// data is the tensor's raw little-endian bytes, in read-only memory
	// that lives until the source is closed.
	data []byte
	// file is where the tensor came from, for messages.
	file string
}

// weightSource is the tensors of a checkpoint: safetensors files or a GGUF
// file.
type weightSource interface {
	// lookup returns the tensor with the Hugging Face name name.
	lookup(name string) (weight, bool)
	// describe names the tensor that name maps to, for messages.
	describe(name string) string
	// each calls fn for every tensor, sorted by its name in the file, for
	// the fingerprint.
	each(fn func(name string, w weight))
	// format is "" for safetensors, else the format's name (it is hashed
	// into the fingerprint).
	format() string
	// memory returns the mappings the weights live in (hugemem's).
	memory() [][]byte
	close() error
}

// safetensorsSource is a weightSource over a safetensors checkpoint.
type safetensorsSource struct{ set *safetensors.Set }

func (s safetensorsSource) lookup(name string) (weight, bool) {
	t, ok := s.set.Tensor(name)
	if !ok {
		return weight{}, false
	}
	return safetensorsWeight(t), true
}

func safetensorsWeight(t safetensors.Tensor) weight {
	w := weight{typeName: string(t.DType), shape: t.Shape, data: t.Data, file: t.File, ok: true}
	switch t.DType {
	case safetensors.F32:
		w.dtype = tensor.F32
	case safetensors.BF16:
		w.dtype = tensor.BF16
	case safetensors.F16:
		w.dtype = tensor.F16
	default:
		w.ok = false
	}
	return w
}

func (s safetensorsSource) describe(name string) string { return fmt.Sprintf("%q", name) }

func (s safetensorsSource) each(fn func(string, weight)) {
	for _, name := range s.set.Names() {
		t, _ := s.set.Tensor(name)
		fn(name, safetensorsWeight(t))
	}
}

func (s safetensorsSource) format() string { return "" }

func (s safetensorsSource) close() error { return s.set.Close() }

func (s safetensorsSource) memory() [][]byte {
	var m [][]byte
	for _, f := range s.set.Files() {
		m = append(m, f.Memory())
	}
	return m
}

// binder resolves tensors by name from a checkpoint and checks their shapes,
// accumulating parameter and byte counts of what it hands out.
type binder struct {
	src    weightSource
	params int64
	bytes  int64
	byType map[tensor.DType]int64
	// mapped records the start of every matrix that aliases the memory
	// mapping (as opposed to a heap copy). Only those may be fused: a view
	// spanning two heap objects would hide the second from the collector.
	mapped map[uintptr]bool
}

func shapeString(s []int) string {
	return fmt.Sprint(s)
}

func (b *binder) lookup(name string, shape ...int) (weight, error) {
	t, ok := b.src.lookup(name)
	if !ok {
		return t, fmt.Errorf("model: tensor %s is missing (expected shape %s)", b.src.describe(name), shapeString(shape))
	}
	if !slices.Equal(t.shape, shape) {
		return t, fmt.Errorf("model: tensor %s: expected shape %s, found %s in %s", b.src.describe(name), shapeString(shape), shapeString(t.shape), t.file)
	}
	if !t.ok {
		return t, fmt.Errorf("model: tensor %s: dtype %s is not supported (expected F32, BF16 or F16)", b.src.describe(name), t.typeName)
	}
	return t, nil
}

// matrix binds a rows×cols weight matrix, aliasing the mapping when the
// dtype is kept as-is and the data is suitably aligned. Quantized matrices
// always alias it (their blocks are bytes).
func (b *binder) matrix(name string, rows, cols int) (tensor.Mat, error) {
	t, err := b.lookup(name, rows, cols)
	if err != nil {
		return tensor.Mat{}, err
	}
	m := tensor.Mat{Rows: rows, Cols: cols, DType: t.dtype}
	n := rows * cols
	switch {
	case t.dtype == tensor.F32:
		m.F32 = f32View(t.data, n)
		b.noteMapped(t.data, unsafe.Pointer(unsafe.SliceData(m.F32)))
	case t.dtype == tensor.BF16, t.dtype == tensor.F16:
		m.U16 = u16View(t.data, n)
		b.noteMapped(t.data, unsafe.Pointer(unsafe.SliceData(m.U16)))
	case t.dtype.Quantized():
		rb, err := t.dtype.RowBytes(cols)
		if err != nil {
			return m, fmt.Errorf("model: tensor %s: %w", b.src.describe(name), err)
		}
		if len(t.data) != rows*rb {
			return m, fmt.Errorf("model: tensor %s: %d bytes of %s data, want %d×%d", b.src.describe(name), len(t.data), t.dtype, rows, rb)
		}
		m.Q = t.data
		b.noteMapped(t.data, unsafe.Pointer(unsafe.SliceData(m.Q)))
	default:
		return m, fmt.Errorf("model: tensor %s: dtype %s is not supported for a matrix", b.src.describe(name), t.typeName)
	}
	b.params += int64(n)
	b.bytes += int64(len(t.data))
	b.byType[m.DType] += int64(len(t.data))
	return m, nil
}

// vector binds a 1-D tensor of length n widened (or dequantized) to f32
// (norm weights and biases are tiny; f32 keeps the elementwise code simple).
func (b *binder) vector(name string, n int) ([]float32, error) {
	t, err := b.lookup(name, n)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	switch {
	case t.dtype == tensor.F32:
		for i := range out {
			out[i] = f32At(t.data, i)
		}
	case t.dtype == tensor.BF16:
		for i := range out {
			out[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(t.data[2*i:]))
		}
	case t.dtype == tensor.F16:
		for i := range out {
			out[i] = tensor.F16ToF32(binary.LittleEndian.Uint16(t.data[2*i:]))
		}
	case t.dtype.Quantized():
		rb, err := t.dtype.RowBytes(n)
		if err != nil || len(t.data) != rb {
			return nil, fmt.Errorf("model: tensor %s: %s data of %d bytes does not hold %d values", b.src.describe(name), t.dtype, len(t.data), n)
		}
		tensor.DequantizeRow(t.dtype, t.data, out)
	default:
		return nil, fmt.Errorf("model: tensor %s: dtype %s is not supported (expected F32, BF16 or F16)", b.src.describe(name), t.typeName)
	}
	b.params += int64(n)
	b.bytes += int64(len(t.data))
	return out, nil
}

func (b *binder) noteMapped(data []byte, view unsafe.Pointer) {
	if len(data) > 0 && unsafe.Pointer(&data[0]) == view {
		b.mapped[uintptr(view)] = true
	}
}

func f32At(b []byte, i int) float32 {
	u := binary.LittleEndian.Uint32(b[4*i:])
	return *(*float32)(unsafe.Pointer(&u))
}

// f32View returns b (holding n little-endian f32s) as []float32, aliasing
// it when aligned and the host is little-endian, copying otherwise.
func f32View(b []byte, n int) []float32 {
	if n == 0 {
		return []float32{}
	}
	if nativeLittleEndian && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = f32At(b, i)
	}
	return out
}

// u16View is f32View for 16-bit elements.
func u16View(b []byte, n int) []uint16 {
	if n == 0 {
		return []uint16{}
	}
	if nativeLittleEndian && uintptr(unsafe.Pointer(&b[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// linearGroup is several linear maps applied to the same input, such as
// q/k/v or gate/up. When their weights happen to lie back to back in memory
// with the same dtype and width (the writer in internal/modelinit lays them
// out so; Hugging Face files often have gate_proj then up_proj) they are run
// as one matmul over a fused view, with no copy: one kernel call and one
// synchronisation instead of several. Either way the output of map k lands
// in columns [off[k], off[k]+rows[k]) of a [T, width] buffer.
type linearGroup struct {
	mats  []tensor.Mat // one fused view, or one per map
	fused bool
	off   []int // column offset of each map's output
	rows  []int
	width int
}

// fusedGroup is a linear group stored as one matrix, its maps' outputs the
// consecutive row ranges of the given sizes (phi3's qkv_proj and
// gate_up_proj).
func fusedGroup(m tensor.Mat, rows ...int) linearGroup {
	g := linearGroup{mats: []tensor.Mat{m}, fused: true, off: make([]int, len(rows)), rows: rows}
	for i, r := range rows {
		g.off[i] = g.width
		g.width += r
	}
	return g
}

func (b *binder) newLinearGroup(mats ...tensor.Mat) linearGroup {
	g := linearGroup{off: make([]int, len(mats)), rows: make([]int, len(mats))}
	for i, m := range mats {
		g.off[i] = g.width
		g.rows[i] = m.Rows
		g.width += m.Rows
	}
	if fused, off, ok := fuseAdjacent(mats, b.mapped); ok {
		g.mats = []tensor.Mat{fused}
		g.off = off
		g.fused = true
		return g
	}
	g.mats = mats
	return g
}

// fuseAdjacent returns a single matrix viewing mats if their storage is one
// contiguous range in some order, with the row offset of each.
func fuseAdjacent(mats []tensor.Mat, mapped map[uintptr]bool) (tensor.Mat, []int, bool) {
	type span struct {
		i     int
		start uintptr
		bytes uintptr
	}
	spans := make([]span, len(mats))
	for i, m := range mats {
		if m.DType != mats[0].DType || m.Cols != mats[0].Cols || m.Rows == 0 {
			return tensor.Mat{}, nil, false
		}
		var p unsafe.Pointer
		var n uintptr
		switch {
		case m.DType == tensor.F32:
			p, n = unsafe.Pointer(unsafe.SliceData(m.F32)), uintptr(len(m.F32))*4
		case m.DType.Quantized():
			p, n = unsafe.Pointer(unsafe.SliceData(m.Q)), uintptr(len(m.Q))
		default:
			p, n = unsafe.Pointer(unsafe.SliceData(m.U16)), uintptr(len(m.U16))*2
		}
		if !mapped[uintptr(p)] {
			return tensor.Mat{}, nil, false
		}
		spans[i] = span{i, uintptr(p), n}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	off := make([]int, len(mats))
	rows := 0
	for k, s := range spans {
		if k > 0 && spans[k-1].start+spans[k-1].bytes != s.start {
			return tensor.Mat{}, nil, false
		}
		off[s.i] = rows
		rows += mats[s.i].Rows
	}
	first := mats[spans[0].i]
	fused := tensor.Mat{DType: first.DType, Rows: rows, Cols: first.Cols}
	switch {
	case first.DType == tensor.F32:
		fused.F32 = unsafe.Slice(unsafe.SliceData(first.F32), rows*first.Cols)
	case first.DType.Quantized():
		rb, _ := first.DType.RowBytes(first.Cols)
		fused.Q = unsafe.Slice(unsafe.SliceData(first.Q), rows*rb)
	default:
		fused.U16 = unsafe.Slice(unsafe.SliceData(first.U16), rows*first.Cols)
	}
	return fused, off, true
}
