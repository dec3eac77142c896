package tensor

// This file is the contract between the kernels and the model. The model
// package only uses what is declared here.

// DType is the element type of a weight matrix in memory.
type DType uint8

// The weight dtypes the kernels read.
const (
	F32  DType = iota // IEEE 754 binary32
	BF16              // bfloat16: the top 16 bits of a binary32
	F16               // IEEE 754 binary16
)

// String returns the dtype's short name ("f32", "bf16", "f16").
func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	}
	return "unknown"
}

// Mat is a row-major weight matrix of Rows×Cols in the Hugging Face Linear
// layout (out_features × in_features). Exactly one of F32 and U16 is set: U16
// holds bf16 or f16 bits (per DType), kept in that dtype and widened inside the
// kernels.
type Mat struct {
	DType      DType
	Rows, Cols int
	F32        []float32
	U16        []uint16
}

// Row returns row r widened to f32 into dst (len Cols) and returns dst. It
// panics if r is out of range or dst is shorter than Cols.
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
	}
	return dst
}
