package tensor

// The Q4_K and Q5_K super-block: the packing of its 6-bit scales and mins,
// its reference quantizer (ggml's quantize_row_q4_K_ref and q5_K, the
// sub-block fits from qkx2.go) and dequantizer, and the level lookup.

// putScaleMinK4 stores the 6-bit scale ls and min lm of sub-block j into
// the 12 packed bytes s (ggml's Q4_K/Q5_K packing; s starts zeroed).
func putScaleMinK4(s []byte, j int, ls, lm uint8) {
	if j < 4 {
		s[j] = ls
		s[j+4] = lm
		return
	}
	s[j+4] = ls&0xf | (lm&0xf)<<4
	s[j-4] |= (ls >> 4) << 6
	s[j] |= (lm >> 4) << 6
}

// scaleMinK4 returns the 6-bit scale and min of sub-block j from the 12
// packed bytes s.
func scaleMinK4(s []byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// quantizeQ4K quantizes one super-block to Q4_K (or Q5_K with five bits).
func quantizeQ4K(x []float32, y []byte, five bool) {
	nmax, rmin, nstep := int32(15), float32(-1), 20
	if five {
		nmax, rmin, nstep = 31, -0.5, 15
	}
	x = x[:qk]
	var fits [8]qkx2Fit
	var st [2]qkx2State
	for j := 0; j < 8; j += 2 {
		st[0].start((*[32]float32)(x[32*j:]), nmax, rmin, 0.1, nstep)
		st[1].start((*[32]float32)(x[32*j+32:]), nmax, rmin, 0.1, nstep)
		qkx2Run(&st[0], &st[1])
		fits[j], fits[j+1] = st[0].fit, st[1].fit
	}
	var maxScale, maxMin float32
	for _, f := range fits {
		if f.scale > maxScale {
			maxScale = f.scale
		}
		if f.negMin > maxMin {
			maxMin = f.negMin
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
		ls := min(63, uint8(nearestInt(float32(invScale*fits[j].scale))))
		lm := min(63, uint8(nearestInt(float32(invMin*fits[j].negMin))))
		putScaleMinK4(s, j, ls, lm)
	}
	d := putF16(y, 0, maxScale/63)
	dmin := putF16(y, 2, maxMin/63)
	var L [qk]uint8
	for j := range 8 {
		xs, l := (*[32]float32)(x[32*j:]), (*[32]uint8)(L[32*j:])
		sc, m := scaleMinK4(s, j)
		dj := d * float32(sc)
		if dj == 0 {
			fits[j].levels(nmax, xs, l)
			continue
		}
		dm := float32(dmin * float32(m))
		for i, v := range xs {
			q := nearestInt((v + dm) / dj)
			l[i] = uint8(max(0, min(nmax, q)))
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

// dequantizeQ4K expands one Q4_K (or Q5_K) super-block.
func dequantizeQ4K(five bool, x []byte, y []float32) {
	d, dmin := f16(x, 0), f16(x, 2)
	s := x[4:16]
	for j := range 8 {
		sc, m := scaleMinK4(s, j)
		dj, mj := d*float32(sc), dmin*float32(m)
		for i := range 32 {
			y[32*j+i] = float32(dj*float32(q4KValue(five, x, 32*j+i))) - mj
		}
	}
}

// q4KValue returns the level (0..15, or 0..31 for Q5_K) of weight i of a
// Q4_K (Q5_K) super-block.
func q4KValue(five bool, x []byte, i int) int32 {
	c, l, hi := i/64, i%32, i%64 >= 32
	qs := x[16:]
	if five {
		qs = x[48:]
	}
	b := qs[32*c+l]
	v := int32(b & 15)
	if hi {
		v = int32(b >> 4)
	}
	if five {
		bit := 2 * c
		if hi {
			bit++
		}
		v |= int32(x[16+l]>>bit&1) << 4
	}
	return v
}
