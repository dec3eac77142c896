package tensor

import (
	"encoding/binary"
	"math"
)

// The reference quantizers of the 32-weight blocks (ggml's
// quantize_row_q8_0_ref, q4_0 and q5_0) and the Q5_0 level lookup.

func quantizeQ8_0(x []float32, y []byte) {
	x, y = x[:32], y[:34]
	_, amax, ok := absMax(x)
	if !ok { // a NaN: max32 forgets it at the next weight, so keep to its order
		amax = 0
		for _, v := range x {
			amax = max32(amax, abs32(v))
		}
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, 0, d)
	for i, v := range x {
		// math.Round(t) is t + ½ (t − ½ below 0) truncated, as the
		// conversion does: the float64 sum is exact for a float32 t
		// below 2⁵², and beyond both are out of the conversion's range.
		t := float64(v * id)
		half := math.Float64frombits(math.Float64bits(t)&(1<<63) | 0x3fe0000000000000)
		y[2+i] = byte(truncInt32(t + half))
	}
}

func quantizeQ5_0(x []float32, y []byte) {
	x, y = x[:32], y[:22]
	mx, _, ok := absMax(x)
	if !ok {
		mx, _ = absMaxNaN(x)
	}
	d := mx / -16
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, 0, d)
	var qh uint32
	for i := range 16 {
		q0 := min(31, uint8(truncInt32(float64(float32(x[i]*id)+16.5))))
		q1 := min(31, uint8(truncInt32(float64(float32(x[16+i]*id)+16.5))))
		y[6+i] = q0&15 | (q1&15)<<4
		qh |= uint32(q0>>4) << i
		qh |= uint32(q1>>4) << (16 + i)
	}
	binary.LittleEndian.PutUint32(y[2:], qh)
}

// truncInt32 converts f to an integer as C's (int) does on x86 (CVTTSS2SI,
// CVTTSD2SI), which the quantizers' bytes follow: toward zero, and -2³¹
// where f is NaN or outside int32's range. Go leaves those cases to the
// platform (arm64 saturates), so converting directly would make other
// bytes there; callers keep the low byte, as the C code's narrowing does.
func truncInt32(f float64) int32 {
	if !(f > -2147483649 && f < 2147483648) {
		return math.MinInt32
	}
	return int32(f)
}

// q5_0Value returns the level (0..31) of weight i of a Q5_0 block.
func q5_0Value(x []byte, i int) int32 {
	qh := binary.LittleEndian.Uint32(x[2:])
	b := x[6+i%16]
	if i >= 16 {
		b >>= 4
	}
	return int32(b&15) | int32(qh>>i&1)<<4
}

func quantizeQ4_0(x []float32, y []byte) {
	x, y = x[:32], y[:18]
	mx, _, ok := absMax(x)
	if !ok {
		mx, _ = absMaxNaN(x)
	}
	d := mx / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, 0, d)
	for i := range 16 {
		q0 := min(15, uint8(truncInt32(float64(float32(x[i]*id)+8.5))))
		q1 := min(15, uint8(truncInt32(float64(float32(x[16+i]*id)+8.5))))
		y[2+i] = q0 | q1<<4
	}
}
