package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// dotNEONRef defines the "neon" set's dot product (kernels_arm64.s): eight
// accumulators of four lanes over steps of 32 elements, each a fused
// multiply-add, the groups of four left into accumulator 0, the lane-wise
// tree ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), the pairwise (v0+v1)+(v2+v3),
// then the last n%4 elements one fused multiply-add each.
func dotNEONRef(x, w []float32) float32 {
	var acc [8][4]float32
	n := len(x)
	n32, n4 := n&^31, n&^3
	for t := 0; t < n32; t += 32 {
		for a := range 8 {
			for l := range 4 {
				i := t + 4*a + l
				acc[a][l] = fma32(x[i], w[i], acc[a][l])
			}
		}
	}
	for t := n32; t < n4; t += 4 {
		for l := range 4 {
			acc[0][l] = fma32(x[t+l], w[t+l], acc[0][l])
		}
	}
	var v [4]float32
	for l := range 4 {
		v[l] = ((acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])) + ((acc[4][l] + acc[5][l]) + (acc[6][l] + acc[7][l]))
	}
	s := (v[0] + v[1]) + (v[2] + v[3])
	for t := n4; t < n; t++ {
		s = fma32(x[t], w[t], s)
	}
	return s
}

func TestNEONDotKernelsMatchTheirDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	// Values across the range, with f16 and bf16 denormals, zeros of both
	// signs and the odd large one.
	val := func() float32 {
		switch rng.IntN(16) {
		case 0:
			return 0
		case 1:
			return float32(math.Copysign(0, -1))
		case 2:
			return float32(rng.NormFloat64()) * 1e-6 // f16 denormal range
		case 3:
			return float32(rng.NormFloat64()) * 3e4
		}
		return float32(rng.NormFloat64())
	}
	for _, n := range []int{0, 1, 3, 4, 5, 31, 32, 33, 36, 63, 64, 67, 100, 255, 1000, 1027, 2048} {
		x := make([]float32, n+1) // +1: a pointer past the end is never read
		w32 := make([]float32, n+1)
		wb := make([]uint16, n+1)
		wh := make([]uint16, n+1)
		for i := range n {
			x[i], w32[i] = val(), val()
			wb[i] = F32ToBF16(val())
			wh[i] = F32ToF16(val())
		}
		wbf, whf := make([]float32, n), make([]float32, n)
		for i := range n {
			wbf[i], whf[i] = BF16ToF32(wb[i]), F16ToF32(wh[i])
		}
		for _, c := range []struct {
			name      string
			got, want float32
		}{
			{"f32", dotF32NEON(&x[0], &w32[0], n), dotNEONRef(x[:n], w32[:n])},
			{"bf16", dotBF16NEON(&x[0], &wb[0], n), dotNEONRef(x[:n], wbf)},
			{"f16", dotF16NEON(&x[0], &wh[0], n), dotNEONRef(x[:n], whf)},
		} {
			if math.Float32bits(c.got) != math.Float32bits(c.want) {
				t.Errorf("%s n=%d: %x (%g), want %x (%g)", c.name, n, math.Float32bits(c.got), c.got, math.Float32bits(c.want), c.want)
			}
		}
	}
}
