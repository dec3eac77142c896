package tensor

import (
	"math"
	"slices"
	"unsafe"
)

// ArgMax returns the index and value of the largest entry of x, the lowest
// index on ties (-0 and +0 tie). NaN entries never win: with no entry above
// -Inf (all -Inf or NaN) it returns 0 and x[0]. For empty x it returns 0
// and -Inf. The result is the same with every ISA.
func ArgMax(x []float32) (int, float32) {
	if len(x) == 0 {
		return 0, float32(math.Inf(-1))
	}
	ks := active.Load()
	var i int
	if ks.argMax == nil {
		i = argMaxGo(x)
	} else {
		i = ks.argMax(&x[0], len(x))
	}
	return i, x[i]
}

// argMaxGo is ArgMax in Go. It tests entries 16 at a time against the
// best so far and looks at single entries only in the groups that beat it.
func argMaxGo(x []float32) int {
	best, bv := 0, float32(math.Inf(-1))
	i := 0
	for ; i+16 <= len(x); i += 16 {
		b := (*[16]float32)(x[i : i+16])
		if b[0] > bv || b[1] > bv || b[2] > bv || b[3] > bv || b[4] > bv || b[5] > bv || b[6] > bv || b[7] > bv ||
			b[8] > bv || b[9] > bv || b[10] > bv || b[11] > bv || b[12] > bv || b[13] > bv || b[14] > bv || b[15] > bv {
			for j, v := range b {
				if v > bv {
					best, bv = i+j, v
				}
			}
		}
	}
	for ; i < len(x); i++ {
		if x[i] > bv {
			best, bv = i, x[i]
		}
	}
	return best
}

// AppendAbove appends to dst the indices i of x with x[i] > t, in
// increasing order, and returns the extended slice. NaN entries are never
// above t, and nothing is above a NaN t. For x[i] >= t pass the next float
// below t (math.Nextafter32(t, float32(math.Inf(-1)))): the two agree on
// every x, -0 and +0 included. It may grow dst to room for len(x) more
// indices whatever it appends, so reuse dst across calls.
func AppendAbove(dst []int32, x []float32, t float32) []int32 {
	ks := active.Load()
	if ks.appendAbove == nil || len(x) == 0 {
		return appendAboveGo(dst, x, t)
	}
	dst = slices.Grow(dst, len(x))
	n := len(dst)
	k := ks.appendAbove(&x[0], len(x), t, unsafe.SliceData(dst[n:n+len(x)]))
	return dst[:n+k]
}

// appendAboveGo is AppendAbove in Go. It skips groups of 8 with nothing
// above t and appends the rest without branching on each entry, as the
// sampler's top-p candidates pass in no predictable pattern.
func appendAboveGo(dst []int32, x []float32, t float32) []int32 {
	i := 0
	for ; i+8 <= len(x); i += 8 {
		b := (*[8]float32)(x[i : i+8])
		if !(b[0] > t || b[1] > t || b[2] > t || b[3] > t || b[4] > t || b[5] > t || b[6] > t || b[7] > t) {
			continue
		}
		dst = slices.Grow(dst, 8)
		n := len(dst)
		d := (*[8]int32)(dst[n : n+8])
		k := 0
		for j, v := range b {
			d[k&7] = int32(i + j)
			k += above(v, t)
		}
		dst = dst[:n+k]
	}
	for ; i < len(x); i++ {
		if x[i] > t {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// above returns 1 if v > t, else 0; the compiler makes it a flag move,
// not a branch.
func above(v, t float32) int {
	k := 0
	if v > t {
		k = 1
	}
	return k
}
