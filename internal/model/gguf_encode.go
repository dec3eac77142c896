package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Tensor encoding: a checkpoint tensor's values widened to f32 (widen) and
// encoded in their planned type (encodeTensor: f32 as they are, rounded to
// bf16 or f16, or quantized by tensor.QuantizeRows, row ranges in
// parallel).

func shapeElems(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// widen returns a safetensors tensor's values as f32.
func widen(t safetensors.Tensor) ([]float32, error) {
	n := int(t.Elements())
	out := make([]float32, n)
	switch t.DType {
	case safetensors.F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
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
		return nil, fmt.Errorf("model: tensor %q: dtype %s is not supported (expected F32, BF16 or F16)", t.Name, t.DType)
	}
	return out, nil
}

// f32Bytes views xs as bytes in host order (for moving whole rows).
func f32Bytes(xs []float32) []byte {
	if len(xs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(xs))), 4*len(xs))
}

// encodeTensor encodes rows×cols values as typ, quantizing row ranges in
// parallel.
func encodeTensor(typ gguf.Type, vals []float32, rows, cols, threads int) ([]byte, error) {
	dt, ok := ggufDType(typ)
	if !ok {
		return nil, errors.New("unsupported type")
	}
	switch dt {
	case tensor.F32:
		out := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
		return out, nil
	case tensor.BF16, tensor.F16:
		out := make([]byte, 2*len(vals))
		for i, v := range vals {
			h := tensor.F32ToBF16(v)
			if dt == tensor.F16 {
				h = tensor.F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(out[2*i:], h)
		}
		return out, nil
	}
	rb, err := dt.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	out := make([]byte, rows*rb)
	per := max(1, (rows+threads-1)/threads)
	var wg sync.WaitGroup
	errs := make([]error, threads)
	for k := range threads {
		lo, hi := k*per, min(rows, (k+1)*per)
		if lo >= hi {
			break
		}
		wg.Go(func() {
			q, err := tensor.QuantizeRows(dt, vals[lo*cols:hi*cols], hi-lo, cols)
			if err != nil {
				errs[k] = err
				return
			}
			copy(out[lo*rb:], q)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
