package gguf

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// Tensor-info parsing: each tensor's name, dimensions, type and offset,
// checked as they are read (unique names, 1 to MaxDims dimensions whose
// product does not overflow, a size that follows from shape and type, an
// aligned offset); then the data section's start and the check that every
// tensor lies within it and overlaps no other.

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
