package sample

import "math"

// exp32 and expSum are the scalar float32 exponential the sampler used
// before it moved to tensor.ExpSum (the same Cephes polynomial, in vector
// form). They stay as test helpers: the full-sort reference filter
// (refKept) computes its weights with exp32.

// exp32 is e**x in float32 with a relative error of about 2 ulp, several
// times faster than math.Exp: Cephes' expf (range reduction by ln 2 split in
// two parts, then a degree-6 polynomial).
func exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
		// Below minArg the result is subnormal; above maxArg it is close to
		// overflow, where the 2**n scale below would not fit the exponent.
		minArg = -87.33654
		maxArg = 88.0
	)
	if x < minArg {
		return 0 // also -Inf
	}
	if x > maxArg {
		return float32(math.Exp(float64(x)))
	}
	// Round x*log2e to the nearest integer n by adding 1.5*2**23, which
	// leaves n in the low mantissa bits; this avoids float-int conversions,
	// which are slow here (false register dependencies).
	const magic = 12582912
	t := x*log2e + magic
	n := int32(math.Float32bits(t)) - int32(math.Float32bits(magic))
	fn := t - magic
	r := x - fn*ln2hi
	r -= fn * ln2lo
	z := r * r
	y := ((((1.9875691500e-4*r+1.3981999507e-3)*r+8.3334519073e-3)*r+4.1665795894e-2)*r+1.6666665459e-1)*r + 5.0000001201e-1
	y = y*z + r + 1
	return y * math.Float32frombits(uint32(n+127)<<23)
}

// expSum sets dst[i] = exp32((src[i]-m)*scale) and returns the sum of dst in
// float64. It repeats exp32's body so the compiler keeps the loop free of
// calls (exp32 is too large to inline); TestExpSumMatchesExp32 holds the two
// to the same bits. dst and src may be the same slice; dst must be at least
// as long as src.
func expSum(dst, src []float32, m, scale float32) float64 {
	const (
		log2e  = 1.44269504088896341
		ln2hi  = 0.693359375
		ln2lo  = -2.12194440e-4
		minArg = -87.33654
		maxArg = 88.0
		magic  = 12582912
	)
	dst = dst[:len(src)]
	var sum float64
	for i, v := range src {
		x := (v - m) * scale
		var e float32
		switch {
		case x < minArg:
			// e = 0, also for -Inf
		case x > maxArg:
			e = float32(math.Exp(float64(x)))
		default:
			t := x*log2e + magic
			n := int32(math.Float32bits(t)) - int32(math.Float32bits(magic))
			fn := t - magic
			r := x - fn*ln2hi
			r -= fn * ln2lo
			z := r * r
			y := ((((1.9875691500e-4*r+1.3981999507e-3)*r+8.3334519073e-3)*r+4.1665795894e-2)*r+1.6666665459e-1)*r + 5.0000001201e-1
			y = y*z + r + 1
			e = y * math.Float32frombits(uint32(n+127)<<23)
		}
		dst[i] = e
		sum += float64(e)
	}
	return sum
}
