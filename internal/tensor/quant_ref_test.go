package tensor

// This file keeps the quantizers of quant.go (since split into its dtype
// files) as they were before they were restructured for speed (commit
// 11a4973), copied verbatim with the names suffixed Ref, so that
// TestQuantizeMatchesReference can hold the fast ones to bit-identical
// output. Do not edit these: they are the
// specification.

import (
	"encoding/binary"
	"math"
)

// putF16Ref stores f rounded to f16 (nearest even) at b[off:] and returns the
// rounded value widened back.
func putF16Ref(b []byte, off int, f float32) float32 {
	h := F32ToF16(f)
	binary.LittleEndian.PutUint16(b[off:], h)
	return F16ToF32(h)
}

// nearestIntRef rounds f to the nearest integer, ties to even, as ggml's
// nearest_int does (by adding 1.5·2²³). Outside ±2²² (where ggml's trick
// fails) it saturates instead.
func nearestIntRef(f float32) int32 {
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

func quantizeQ8_0Ref(x []float32, y []byte) {
	var amax float32
	for _, v := range x {
		amax = max32Ref(amax, abs32Ref(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16Ref(y, 0, d)
	for i, v := range x {
		y[2+i] = byte(int8(math.Round(float64(v * id))))
	}
}

func quantizeQ5_0Ref(x []float32, y []byte) {
	var amax, mx float32
	for _, v := range x {
		if amax < abs32Ref(v) {
			amax, mx = abs32Ref(v), v
		}
	}
	d := mx / -16
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16Ref(y, 0, d)
	var qh uint32
	for i := range 16 {
		q0 := min(31, uint8(int8(x[i]*id+16.5)))
		q1 := min(31, uint8(int8(x[16+i]*id+16.5)))
		y[6+i] = q0&15 | (q1&15)<<4
		qh |= uint32(q0>>4) << i
		qh |= uint32(q1>>4) << (16 + i)
	}
	binary.LittleEndian.PutUint32(y[2:], qh)
}

// max32Ref is C's MAX(a, b): (a > b) ? a : b.
func max32Ref(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func abs32Ref(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func quantizeQ4_0Ref(x []float32, y []byte) {
	var amax, mx float32
	for _, v := range x {
		if amax < abs32Ref(v) {
			amax, mx = abs32Ref(v), v
		}
	}
	d := mx / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16Ref(y, 0, d)
	for i := range 16 {
		x0, x1 := x[i]*id, x[16+i]*id
		q0 := min(15, uint8(int8(x0+8.5)))
		q1 := min(15, uint8(int8(x1+8.5)))
		y[2+i] = q0 | q1<<4
	}
}

// makeQKX2Ref is ggml's make_qkx2_quants: it chooses a scale and a min (≤ 0)
// for x with levels 0..nmax, trying nstep+1 scales around the range's and
// fitting scale and min by weighted least squares at each, and returns the
// scale and −min with the levels in l.
func makeQKX2Ref(nmax int, x, w []float32, l, laux []uint8, rmin, rdelta float32, nstep int) (scale, negMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		clear(l[:n])
		return 0, -mn
	}
	fmax := float32(nmax)
	iscale := fmax / (mx - mn)
	scale = 1 / iscale
	var bestErr float32
	for i := range n {
		q := nearestIntRef(iscale * (x[i] - mn))
		l[i] = uint8(max(0, min(int32(nmax), q)))
		diff := float32(scale*float32(l[i])) + mn - x[i]
		bestErr += float32(w[i] * float32(diff*diff))
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fmax) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			q := nearestIntRef(iscale * (x[i] - mn))
			q = max(0, min(int32(nmax), q))
			laux[i] = uint8(q)
			fl := float32(q)
			wl := w[i] * fl
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var cur float32
			for i := range n {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				cur += float32(w[i] * float32(diff*diff))
			}
			if cur < bestErr {
				copy(l[:n], laux[:n])
				bestErr, scale, mn = cur, thisScale, thisMin
			}
		}
	}
	return scale, -mn
}

// putScaleMinK4Ref stores the 6-bit scale ls and min lm of sub-block j into
// the 12 packed bytes s (ggml's Q4_K/Q5_K packing; s starts zeroed).
func putScaleMinK4Ref(s []byte, j int, ls, lm uint8) {
	if j < 4 {
		s[j] = ls
		s[j+4] = lm
		return
	}
	s[j+4] = ls&0xf | (lm&0xf)<<4
	s[j-4] |= (ls >> 4) << 6
	s[j] |= (lm >> 4) << 6
}

// scaleMinK4Ref returns the 6-bit scale and min of sub-block j from the 12
// packed bytes s.
func scaleMinK4Ref(s []byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// quantizeQ4KRef quantizes one super-block to Q4_K (or Q5_K with five bits).
func quantizeQ4KRef(x []float32, y []byte, five bool) {
	nmax, rmin, nstep := 15, float32(-1), 20
	if five {
		nmax, rmin, nstep = 31, -0.5, 15
	}
	var L [qk]uint8
	var laux [32]uint8
	var weights [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for i, v := range xs {
			weights[i] = av + abs32Ref(v)
		}
		scales[j], mins[j] = makeQKX2Ref(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	s := y[4:16]
	clear(s)
	for j := range 8 {
		ls := min(63, uint8(nearestIntRef(invScale*scales[j])))
		lm := min(63, uint8(nearestIntRef(invMin*mins[j])))
		putScaleMinK4Ref(s, j, ls, lm)
	}
	d := putF16Ref(y, 0, maxScale/63)
	dmin := putF16Ref(y, 2, maxMin/63)
	for j := range 8 {
		sc, m := scaleMinK4Ref(s, j)
		dj := d * float32(sc)
		if dj == 0 {
			continue
		}
		dm := dmin * float32(m)
		for i := range 32 {
			q := nearestIntRef((x[32*j+i] + dm) / dj)
			L[32*j+i] = uint8(max(0, min(int32(nmax), q)))
		}
	}
	if !five {
		qs := y[16:144]
		for c := range 4 {
			for l := range 32 {
				qs[32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
			}
		}
		return
	}
	qh, qs := y[16:48], y[48:176]
	clear(qh)
	for c := range 4 {
		for l := range 32 {
			l1, l2 := L[64*c+l], L[64*c+32+l]
			if l1 > 15 {
				l1 -= 16
				qh[l] |= 1 << (2 * c)
			}
			if l2 > 15 {
				l2 -= 16
				qh[l] |= 2 << (2 * c)
			}
			qs[32*c+l] = l1 | l2<<4
		}
	}
}

// makeQXRef is ggml's make_qx_quants with rmse_type 1 and no importance
// weights: the scale for x with levels −nmax..nmax−1 (stored as l+nmax)
// that maximises the x²-weighted fit over 19 trial scales.
func makeQXRef(nmax int, x []float32, L []int8) float32 {
	var mx, amax float32
	for _, v := range x {
		if ax := abs32Ref(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax < 1e-15 {
		clear(L[:len(x)])
		return 0
	}
	fmax := float32(nmax)
	clampL := func(q int32) int32 { return max(int32(-nmax), min(int32(nmax-1), q)) }
	iscale := -fmax / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		q := clampL(nearestIntRef(iscale * v))
		L[i] = int8(q + int32(nmax))
		w := v * v
		fl := float32(q)
		sumLX += float32(float32(w*v) * fl)
		sumL2 += float32(float32(w*fl) * fl)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fmax + float32(0.1*float32(is))) / mx
		sumLX, sumL2 = 0, 0
		for _, v := range x {
			q := clampL(nearestIntRef(iscale * v))
			w := v * v
			fl := float32(q)
			sumLX += float32(float32(w*v) * fl)
			sumL2 += float32(float32(w*fl) * fl)
		}
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			for i, v := range x {
				L[i] = int8(clampL(nearestIntRef(iscale*v)) + int32(nmax))
			}
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// quantizeQ6KRef quantizes one super-block to Q6_K.
func quantizeQ6KRef(x []float32, y []byte) {
	var L [qk]int8
	var scales [16]float32
	var maxScale, maxAbs float32
	for ib := range 16 {
		s := makeQXRef(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if a := abs32Ref(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	if maxAbs < 1e-15 {
		clear(y[:210])
		return
	}
	iscale := -128 / maxScale
	d := putF16Ref(y, 208, 1/iscale)
	for ib := range 16 {
		y[192+ib] = byte(int8(min(127, nearestIntRef(iscale*scales[ib]))))
	}
	for j := range 16 {
		dj := d * float32(int8(y[192+j]))
		if dj == 0 {
			continue
		}
		for i := range 16 {
			q := nearestIntRef(x[16*j+i] / dj)
			L[16*j+i] = int8(max(-32, min(31, q)) + 32)
		}
	}
	ql, qh := y[0:128], y[128:192]
	for h := range 2 {
		for l := range 32 {
			q1 := uint8(L[128*h+l]) & 0xf
			q2 := uint8(L[128*h+l+32]) & 0xf
			q3 := uint8(L[128*h+l+64]) & 0xf
			q4 := uint8(L[128*h+l+96]) & 0xf
			ql[64*h+l] = q1 | q3<<4
			ql[64*h+l+32] = q2 | q4<<4
			qh[32*h+l] = uint8(L[128*h+l])>>4 | (uint8(L[128*h+l+32])>>4)<<2 |
				(uint8(L[128*h+l+64])>>4)<<4 | (uint8(L[128*h+l+96])>>4)<<6
		}
	}
}
