package tensor

import "math"

// expf returns e^x in float32, within 2 ulp of the correctly rounded value
// for finite results. It reduces x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split
// in two parts for an exact product), evaluates a degree-6 polynomial for
// e^r and scales by 2^n, in float32 without fused operations, so it is
// deterministic and several times faster than math.Exp.
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
		maxX  = 88.72283905206835 // e^maxX is the largest finite float32
		minX  = -103.97208        // below this e^x underflows to zero
	)
	switch {
	case x != x: // NaN
		return x
	case x > maxX:
		return float32(math.Inf(1))
	case x < minX:
		return 0
	}
	n := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - float32(n*ln2hi)
	r -= float32(n * ln2lo)
	// Cephes expf minimax polynomial for e^r on [-ln2/2, ln2/2].
	p := float32(1.9875691500e-4)
	p = float32(p*r) + 1.3981999507e-3
	p = float32(p*r) + 8.3334519073e-3
	p = float32(p*r) + 4.1665795894e-2
	p = float32(p*r) + 1.6666665459e-1
	p = float32(p*r) + 5.0000001201e-1
	r2 := float32(r * r)
	e := float32(float32(p*r2)+r) + 1
	// Scale by 2^n in two steps so that subnormal results stay accurate.
	ni := int32(n)
	if ni < -125 {
		e *= math.Float32frombits(uint32(ni+126+127) << 23)
		return e * math.Float32frombits(uint32(-126+127)<<23)
	}
	if ni > 127 {
		return e * 2 * math.Float32frombits(uint32(ni-1+127)<<23)
	}
	return e * math.Float32frombits(uint32(ni+127)<<23)
}
