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

// binder resolves tensors by name from a checkpoint and checks their shapes,
// accumulating parameter and byte counts of what it hands out.
type binder struct {
	set    *safetensors.Set
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

func (b *binder) lookup(name string, shape ...int) (safetensors.Tensor, error) {
	t, ok := b.set.Tensor(name)
	if !ok {
		return t, fmt.Errorf("model: tensor %q is missing (expected shape %s)", name, shapeString(shape))
	}
	if !slices.Equal(t.Shape, shape) {
		return t, fmt.Errorf("model: tensor %q: expected shape %s, found %s in %s", name, shapeString(shape), shapeString(t.Shape), t.File)
	}
	return t, nil
}

// matrix binds a rows×cols weight matrix, aliasing the mapping when the
// dtype is kept as-is and the data is suitably aligned.
func (b *binder) matrix(name string, rows, cols int) (tensor.Mat, error) {
	t, err := b.lookup(name, rows, cols)
	if err != nil {
		return tensor.Mat{}, err
	}
	m := tensor.Mat{Rows: rows, Cols: cols}
	n := rows * cols
	switch t.DType {
	case safetensors.F32:
		m.DType = tensor.F32
		m.F32 = f32View(t.Data, n)
		b.noteMapped(t.Data, unsafe.Pointer(unsafe.SliceData(m.F32)))
	case safetensors.BF16, safetensors.F16:
		m.DType = tensor.BF16
		if t.DType == safetensors.F16 {
			m.DType = tensor.F16
		}
		m.U16 = u16View(t.Data, n)
		b.noteMapped(t.Data, unsafe.Pointer(unsafe.SliceData(m.U16)))
	default:
		return m, fmt.Errorf("model: tensor %q: dtype %s is not supported (expected F32, BF16 or F16)", name, t.DType)
	}
	b.params += int64(n)
	b.bytes += int64(len(t.Data))
	b.byType[m.DType] += int64(len(t.Data))
	return m, nil
}

// vector binds a 1-D tensor of length n widened to f32 (norm weights and
// biases are tiny; f32 keeps the elementwise code simple).
func (b *binder) vector(name string, n int) ([]float32, error) {
	t, err := b.lookup(name, n)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	switch t.DType {
	case safetensors.F32:
		for i := range out {
			out[i] = f32At(t.Data, i)
		}
	case safetensors.BF16:
		for i := range out {
			out[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case safetensors.F16:
		for i := range out {
			out[i] = tensor.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("model: tensor %q: dtype %s is not supported (expected F32, BF16 or F16)", name, t.DType)
	}
	b.params += int64(n)
	b.bytes += int64(len(t.Data))
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
		if m.DType == tensor.F32 {
			p, n = unsafe.Pointer(unsafe.SliceData(m.F32)), uintptr(len(m.F32))*4
		} else {
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
	if first.DType == tensor.F32 {
		fused.F32 = unsafe.Slice(unsafe.SliceData(first.F32), rows*first.Cols)
	} else {
		fused.U16 = unsafe.Slice(unsafe.SliceData(first.U16), rows*first.Cols)
	}
	return fused, off, true
}
