package tensor

import (
	"fmt"
	"strings"
)

// This file is the contract between the kernels and the model. The model
// package only uses what is declared here.

// DType is the element type of a weight matrix in memory.
type DType uint8

// The weight dtypes the kernels read. The numeric values are stable (the
// KV cache records F32 and BF16 in its header); new dtypes are appended.
//
// The quantized dtypes store a row as a sequence of blocks whose byte
// layout is exactly ggml's (GGUF tensor data can be aliased without
// conversion). All multi-byte fields are little endian; "f16" is an IEEE
// binary16 scale.
const (
	F32  DType = iota // IEEE 754 binary32
	BF16              // bfloat16: the top 16 bits of a binary32
	F16               // IEEE 754 binary16

	// Q8_0 (ggml block_q8_0): 32 weights in 34 bytes: f16 d, then 32
	// int8 q; weight i = q[i]·d.
	Q8_0
	// Q4_0 (ggml block_q4_0): 32 weights in 18 bytes: f16 d, then 16
	// bytes qs; weight i < 16 is (qs[i]&15 − 8)·d, weight 16+i is
	// (qs[i]>>4 − 8)·d.
	Q4_0
	// Q4_K (ggml block_q4_K): 256 weights in 144 bytes: f16 d, f16 dmin,
	// 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32 (sub-block
	// j < 4: scale = s[j]&63, min = s[j+4]&63; j ≥ 4: scale =
	// s[j+4]&15 | (s[j-4]>>6)<<4, min = s[j+4]>>4 | (s[j]>>6)<<4), then
	// 128 bytes qs: for chunk c < 4, byte qs[32c+l] holds weight 64c+l in
	// its low nibble and weight 64c+32+l in its high nibble; weight i of
	// sub-block j is d·scale_j·q − dmin·min_j.
	Q4_K
	// Q6_K (ggml block_q6_K): 256 weights in 210 bytes: 128 bytes ql
	// (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales (one per
	// 16 weights), f16 d. For half h < 2 and l < 32, with ql' = ql[64h:],
	// qh' = qh[32h:]: weight 128h+l has low bits ql'[l]&15 and high bits
	// qh'[l]&3, 128h+32+l has ql'[32+l]&15 and (qh'[l]>>2)&3, 128h+64+l
	// has ql'[l]>>4 and (qh'[l]>>4)&3, 128h+96+l has ql'[32+l]>>4 and
	// qh'[l]>>6; weight i is d·scales[i/16]·(q − 32).
	Q6_K
	// Q5_K (ggml block_q5_K): 256 weights in 176 bytes: f16 d, f16 dmin,
	// 12 bytes of scales and mins packed as in Q4_K, 32 bytes qh, 128
	// bytes qs packed as in Q4_K; weight 64c+l (sub-block 2c) gets its
	// fifth bit from bit 2c of qh[l], weight 64c+32+l (sub-block 2c+1)
	// from bit 2c+1.
	Q5_K
	// Q5_0 (ggml block_q5_0): 32 weights in 22 bytes: f16 d, a 32-bit qh,
	// 16 bytes qs; weight i < 16 is (qs[i]&15 | (qh>>i&1)<<4 − 16)·d,
	// weight 16+i is (qs[i]>>4 | (qh>>(16+i)&1)<<4 − 16)·d. llama.cpp
	// quantizes to it the Q4_K tensors whose rows are no multiple of 256.
	Q5_0
)

// numDTypes is the number of dtypes: tables indexed by DType have it.
const numDTypes = Q5_0 + 1

// dtypeNames are the short names String returns and ParseDType accepts.
var dtypeNames = [...]string{F32: "f32", BF16: "bf16", F16: "f16", Q8_0: "q8_0", Q4_0: "q4_0", Q4_K: "q4_k", Q6_K: "q6_k", Q5_K: "q5_k", Q5_0: "q5_0"}

// String returns the dtype's short name ("f32", "bf16", "f16", "q8_0",
// "q4_0", "q4_k", "q6_k", "q5_k", "q5_0"), or "unknown".
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return "unknown"
}

// ParseDType returns the dtype whose String is s (case-insensitive).
func ParseDType(s string) (DType, error) {
	for d, name := range dtypeNames {
		if strings.EqualFold(s, name) {
			return DType(d), nil
		}
	}
	return 0, fmt.Errorf("tensor: unknown dtype %q (known: %s)", s, strings.Join(dtypeNames[:], ", "))
}

// Quantized reports whether d is a block-quantized dtype (its matrices use
// Mat.Q).
func (d DType) Quantized() bool { return d >= Q8_0 && d <= Q5_0 }

// BlockSize returns how many weights one block of d holds and how many
// bytes it takes: (1, 4) for F32, (1, 2) for BF16 and F16, (32, 34) for
// Q8_0, (32, 18) for Q4_0, (256, 144) for Q4_K, (256, 210) for Q6_K,
// (256, 176) for Q5_K, (32, 22) for Q5_0, and (0, 0) for an unknown
// dtype. A quantized
// matrix's Cols must be a multiple of elems.
func (d DType) BlockSize() (elems, bytes int) {
	switch d {
	case F32:
		return 1, 4
	case BF16, F16:
		return 1, 2
	case Q8_0:
		return 32, 34
	case Q4_0:
		return 32, 18
	case Q4_K:
		return 256, 144
	case Q6_K:
		return 256, 210
	case Q5_K:
		return 256, 176
	case Q5_0:
		return 32, 22
	}
	return 0, 0
}

// RowBytes returns the size in bytes of a row of cols weights of dtype d,
// or an error if d is unknown or cols is negative or not a multiple of the
// dtype's block.
func (d DType) RowBytes(cols int) (int, error) {
	elems, bytes := d.BlockSize()
	switch {
	case elems == 0:
		return 0, fmt.Errorf("tensor: unknown dtype %d", d)
	case cols < 0 || cols%elems != 0:
		return 0, fmt.Errorf("tensor: %s rows of %d weights: must be a multiple of the %d-weight block", d, cols, elems)
	}
	return cols / elems * bytes, nil
}

// Mat is a row-major weight matrix of Rows×Cols in the Hugging Face Linear
// layout (out_features × in_features). Exactly one of F32, U16 and Q is set,
// per DType: F32 for F32; U16 holds bf16 or f16 bits, kept in that dtype and
// widened inside the kernels; Q holds the raw blocks of a quantized dtype,
// row after row, each row Cols/elems blocks (see DType.BlockSize; Cols must
// be a multiple of elems, which the code binding a matrix checks, e.g. with
// DType.RowBytes).
type Mat struct {
	DType      DType
	Rows, Cols int
	F32        []float32
	U16        []uint16
	Q          []byte
	// Panels: Q holds Q8_0, Q4_0 or Q4_K weights as the AVX-512 kernels'
	// panels (see PackPanels), not ggml's rows.
	Panels bool
}

// Row returns row r widened (or dequantized, see DequantizeRow) to f32 into
// dst (len Cols) and returns dst. It panics if r is out of range or dst is
// shorter than Cols.
func (m *Mat) Row(r int, dst []float32) []float32 {
	dst = dst[:m.Cols]
	switch m.DType {
	case F32:
		copy(dst, m.F32[r*m.Cols:(r+1)*m.Cols])
	case BF16:
		src := m.U16[r*m.Cols : (r+1)*m.Cols]
		for i, b := range src {
			dst[i] = BF16ToF32(b)
		}
	case F16:
		src := m.U16[r*m.Cols : (r+1)*m.Cols]
		for i, b := range src {
			dst[i] = F16ToF32(b)
		}
	default:
		rb, err := m.DType.RowBytes(m.Cols)
		if err != nil {
			panic(err.Error())
		}
		if r < 0 || r >= m.Rows {
			panic(fmt.Sprintf("tensor: Mat.Row(%d) of %d rows", r, m.Rows))
		}
		if m.Panels {
			dequantizePanelRow(m, r, dst)
			break
		}
		DequantizeRow(m.DType, m.Q[r*rb:(r+1)*rb], dst)
	}
	return dst
}
