package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// These files hold the reference (de)quantization of the block dtypes: the
// algorithms of ggml's reference quantizers (quantize_row_*_ref, the path
// without an importance matrix), so that a file we quantize agrees with one
// llama.cpp makes from the same f32 weights, and the dequantization that
// defines what a block means. Everything is plain float32 arithmetic with
// no fused multiply-adds (a C compiler may contract some of llama.cpp's
// expressions, so agreement is close but not always bit-exact; see the
// tests for the bounds): every product that feeds a sum is converted to
// float32 explicitly, which forbids the fusion, so the bytes do not depend
// on GOAMD64 or the architecture.
//
// The quantizers run ggml's float32 operations in ggml's order, but their
// loops are arranged for speed (see qkx2State for Q4_K and Q5_K, makeQX for
// Q6_K); quant_ref_test.go keeps the straightforward port they replaced,
// to hold them to its bytes.
//
// This file holds the entry points (QuantizeRows, DequantizeRow, which
// dispatch on the dtype) and the scalar helpers the dtypes share; the
// dtypes are in quant32.go (Q8_0, Q4_0, Q5_0), quantq4k.go (Q4_K, Q5_K,
// with ggml's make_qkx2_quants in qkx2.go) and quantq6k.go (Q6_K, with
// make_qx_quants in qx.go).

// qk is the number of weights in a K-quant super-block.
const qk = 256

// QuantizeRows quantizes the rows×cols row-major f32 matrix src to dtype d
// and returns the blocks, row after row (rows·RowBytes(cols) bytes). cols
// must be a multiple of the dtype's block (32 for Q8_0 and Q4_0, 256 for
// the K-quants), and src must hold rows·cols values.
//
//   - Q8_0: d = max|x|/127, q = round(x/d) (half away from zero).
//   - Q4_0: d = −m/8 where m is the value of largest magnitude, q =
//     min(15, trunc(x/d + 8.5)); Q5_0 likewise with −m/16 and 16.5.
//   - Q4_K, Q5_K: per sub-block of 32 a scale and min from ggml's
//     make_qkx2_quants search (weights av|x| + |x|, 20 and 15 steps), both
//     quantized to 6 bits against the largest, then the weights
//     re-quantized with the 6-bit values.
//   - Q6_K: per sub-block of 16 a scale from ggml's make_qx_quants search
//     (weights x²), quantized to int8 against the largest, then the
//     weights re-quantized.
func QuantizeRows(d DType, src []float32, rows, cols int) ([]byte, error) {
	if !d.Quantized() {
		return nil, fmt.Errorf("tensor: QuantizeRows to %s: not a quantized dtype", d)
	}
	if rows < 0 {
		return nil, fmt.Errorf("tensor: QuantizeRows with %d rows", rows)
	}
	rb, err := d.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	if len(src) < rows*cols {
		return nil, fmt.Errorf("tensor: QuantizeRows of %d×%d from %d values", rows, cols, len(src))
	}
	out := make([]byte, rows*rb)
	elems, bytes := d.BlockSize()
	for r := range rows {
		row := src[r*cols : (r+1)*cols]
		dst := out[r*rb : (r+1)*rb]
		for b := 0; b < cols/elems; b++ {
			x, y := row[b*elems:(b+1)*elems], dst[b*bytes:(b+1)*bytes]
			switch d {
			case Q8_0:
				quantizeQ8_0(x, y)
			case Q4_0:
				quantizeQ4_0(x, y)
			case Q5_0:
				quantizeQ5_0(x, y)
			case Q4_K:
				quantizeQ4K(x, y, false)
			case Q5_K:
				quantizeQ4K(x, y, true)
			case Q6_K:
				quantizeQ6K(x, y)
			}
		}
	}
	return out, nil
}

// DequantizeRow expands the blocks in src to len(dst) f32 weights: the
// exact reference meaning of each block (see the DType constants), in
// float32 arithmetic: Q8_0 q·d, Q4_0 (q−8)·d, Q5_0 (q−16)·d, Q4_K and Q5_K (d·scale)·q −
// dmin·min, Q6_K (d·scale)·(q−32). len(dst) must be a multiple of the
// dtype's block and src must hold that many blocks; DequantizeRow panics
// otherwise or if d is not quantized.
func DequantizeRow(d DType, src []byte, dst []float32) {
	if !d.Quantized() {
		panic(fmt.Sprintf("tensor: DequantizeRow of %s: not a quantized dtype", d))
	}
	rb, err := d.RowBytes(len(dst))
	if err != nil {
		panic(err.Error())
	}
	if len(src) < rb {
		panic(fmt.Sprintf("tensor: DequantizeRow of %d %s weights from %d bytes, want %d", len(dst), d, len(src), rb))
	}
	elems, bytes := d.BlockSize()
	for b := 0; b < len(dst)/elems; b++ {
		x, y := src[b*bytes:(b+1)*bytes], dst[b*elems:(b+1)*elems]
		switch d {
		case Q8_0:
			s := f16(x, 0)
			for i := range 32 {
				y[i] = float32(int8(x[2+i])) * s
			}
		case Q4_0:
			s := f16(x, 0)
			for i := range 16 {
				y[i] = float32(int32(x[2+i]&15)-8) * s
				y[16+i] = float32(int32(x[2+i]>>4)-8) * s
			}
		case Q5_0:
			s := f16(x, 0)
			for i := range 32 {
				y[i] = float32(q5_0Value(x, i)-16) * s
			}
		case Q4_K, Q5_K:
			dequantizeQ4K(d == Q5_K, x, y)
		case Q6_K:
			s := f16(x, 208)
			for i := range qk {
				q, sc := q6Value(x, i)
				y[i] = float32(s*float32(sc)) * float32(q-32)
			}
		}
	}
}

// f16 returns the f16 at b[off:] widened to f32.
func f16(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// putF16 stores f rounded to f16 (nearest even) at b[off:] and returns the
// rounded value widened back.
func putF16(b []byte, off int, f float32) float32 {
	h := F32ToF16(f)
	binary.LittleEndian.PutUint16(b[off:], h)
	return F16ToF32(h)
}

// nearestInt rounds f to the nearest integer, ties to even, as ggml's
// nearest_int does (by adding 1.5·2²³). Outside ±2²² (where ggml's trick
// fails) it saturates instead.
func nearestInt(f float32) int32 {
	switch {
	case f > 4194303:
		return 4194303
	case f < -4194303:
		return -4194303
	case f != f: // NaN
		return 0
	}
	v := f + 12582912
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

// absMax returns the first value of largest magnitude in x and that
// magnitude, as a loop `if amax < |v| { amax, mx = |v|, v }` from 0 finds
// them, comparing the magnitudes' bit patterns as integers, which takes no
// branch. ok is false, and the results meaningless, if x holds a NaN.
func absMax(x []float32) (mx, amax float32, ok bool) {
	var ab, vb, nan uint32
	for _, v := range x {
		b := math.Float32bits(v)
		a := b &^ (1 << 31)
		nan |= (0x7f800000 - a) >> 31 // a > 0x7f800000
		if a > ab {
			ab, vb = a, b
		}
	}
	return math.Float32frombits(vb), math.Float32frombits(ab), nan == 0
}

// absMaxNaN is absMax for an x that holds a NaN, in order.
func absMaxNaN(x []float32) (mx, amax float32) {
	for _, v := range x {
		if amax < abs32(v) {
			amax, mx = abs32(v), v
		}
	}
	return mx, amax
}

// max32 is C's MAX(a, b): (a > b) ? a : b.
func max32(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// roundMagic is what ggml's nearest_int adds, 1.5·2²³: for |f| < 2²² the
// float32 sum f + roundMagic is an integer in [2²³, 2²⁴), rounded to nearest
// even, so it is roundMagic + round(f), its bit pattern is 0x4b400000 +
// round(f), and (f + roundMagic) − roundMagic is round(f) exactly.
const roundMagic float32 = 12582912
