package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// MaxHeaderSize bounds the JSON header length a file may declare (the
// reference implementation uses the same limit), so a corrupt length cannot
// make the reader allocate or scan gigabytes.
const MaxHeaderSize = 100 << 20

// DType is a safetensors element type name such as "BF16".
type DType string

// The element types of the safetensors format.
const (
	BOOL   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	I16    DType = "I16"
	U16    DType = "U16"
	F16    DType = "F16"
	BF16   DType = "BF16"
	I32    DType = "I32"
	U32    DType = "U32"
	F32    DType = "F32"
	F64    DType = "F64"
	I64    DType = "I64"
	U64    DType = "U64"
)

// Size returns the size of one element in bytes, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case BOOL, U8, I8, F8E4M3, F8E5M2:
		return 1
	case I16, U16, F16, BF16:
		return 2
	case I32, U32, F32:
		return 4
	case F64, I64, U64:
		return 8
	}
	return 0
}

// Info describes one tensor of a file: its element type, its shape and where
// its bytes lie, as [Begin, End) relative to the start of the data section.
type Info struct {
	Name       string
	DType      DType
	Shape      []int
	Begin, End int64
}

// Elements returns the number of elements (the product of Shape; 1 for a
// scalar).
func (i Info) Elements() int64 {
	n := int64(1)
	for _, d := range i.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed safetensors header.
type Header struct {
	// Tensors in the order of their data offsets.
	Tensors []Info
	// Metadata is the optional "__metadata__" string map.
	Metadata map[string]string
	// DataStart is the file offset of the data section (8 + header length).
	DataStart int64
}

type rawInfo struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// ParseHeader parses and validates the header at the start of a file of
// fileSize bytes. prefix must hold at least the first 8 bytes; if it holds
// fewer than 8+N bytes, ParseHeader reports how many it needs through
// NeedError so a caller can read more and retry. Validation covers the
// header length, JSON syntax, element types, shapes (non-negative, no
// overflow), offsets (ordered, inside the data section, matching
// shape×element size) and overlaps between tensors.
func ParseHeader(prefix []byte, fileSize int64) (*Header, error) {
	if len(prefix) < 8 || fileSize < 8 {
		return nil, fmt.Errorf("safetensors: file too short: need at least 8 bytes for the header length, found %d", min(int64(len(prefix)), fileSize))
	}
	n := binary.LittleEndian.Uint64(prefix[:8])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the limit of %d bytes (corrupt file?)", n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("safetensors: header length %d runs past the end of the %d-byte file (truncated?)", n, fileSize)
	}
	if int64(len(prefix)) < 8+int64(n) {
		return nil, &NeedError{Bytes: 8 + int64(n)}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(prefix[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("safetensors: header is not a JSON object: %w", err)
	}
	h := &Header{DataStart: 8 + int64(n)}
	dataSize := fileSize - h.DataStart
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors: __metadata__: expected an object of strings: %w", err)
			}
			continue
		}
		info, err := parseInfo(name, msg, dataSize)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, info)
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	// Sorted by start, a non-empty tensor overlaps an earlier one exactly
	// when it starts before the furthest end seen so far.
	last := -1
	for i, cur := range h.Tensors {
		if cur.End == cur.Begin {
			continue
		}
		if last >= 0 && cur.Begin < h.Tensors[last].End {
			prev := h.Tensors[last]
			return nil, fmt.Errorf("safetensors: tensor %q bytes [%d,%d) overlap tensor %q bytes [%d,%d)", cur.Name, cur.Begin, cur.End, prev.Name, prev.Begin, prev.End)
		}
		if last < 0 || cur.End > h.Tensors[last].End {
			last = i
		}
	}
	return h, nil
}

func parseInfo(name string, msg json.RawMessage, dataSize int64) (Info, error) {
	var r rawInfo
	if err := json.Unmarshal(msg, &r); err != nil {
		return Info{}, fmt.Errorf("safetensors: tensor %q: expected {dtype, shape, data_offsets}: %w", name, err)
	}
	if r.DType == nil || r.Shape == nil || r.DataOffsets == nil {
		return Info{}, fmt.Errorf("safetensors: tensor %q: missing dtype, shape or data_offsets", name)
	}
	info := Info{Name: name, DType: DType(*r.DType)}
	es := info.DType.Size()
	if es == 0 {
		return Info{}, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, *r.DType)
	}
	elems := uint64(1)
	info.Shape = make([]int, len(*r.Shape))
	for i, d := range *r.Shape {
		if d < 0 {
			return Info{}, fmt.Errorf("safetensors: tensor %q: dimension %d is %d, expected a non-negative size", name, i, d)
		}
		hi, lo := bits.Mul64(elems, uint64(d))
		if hi != 0 || lo > math.MaxInt64/8 {
			return Info{}, fmt.Errorf("safetensors: tensor %q: shape %v overflows", name, *r.Shape)
		}
		elems = lo
		info.Shape[i] = int(d)
	}
	off := *r.DataOffsets
	if len(off) != 2 {
		return Info{}, fmt.Errorf("safetensors: tensor %q: data_offsets must have 2 entries, found %d", name, len(off))
	}
	info.Begin, info.End = off[0], off[1]
	if info.Begin < 0 || info.End < info.Begin || info.End > dataSize {
		return Info{}, fmt.Errorf("safetensors: tensor %q: data_offsets [%d,%d) outside the %d-byte data section (truncated file?)", name, info.Begin, info.End, dataSize)
	}
	if want := int64(elems) * int64(es); info.End-info.Begin != want {
		return Info{}, fmt.Errorf("safetensors: tensor %q: %s shape %v needs %d bytes, data_offsets [%d,%d) hold %d", name, info.DType, info.Shape, want, info.Begin, info.End, info.End-info.Begin)
	}
	return info, nil
}

// NeedError is returned by ParseHeader when prefix is shorter than the
// header it declares.
type NeedError struct {
	// Bytes is the prefix length needed (8 + header length).
	Bytes int64
}

// Error says how many leading bytes the header needs.
func (e *NeedError) Error() string {
	return fmt.Sprintf("safetensors: need the first %d bytes to parse the header", e.Bytes)
}
