package tensor

// The Q6_K super-block: its reference quantizer (ggml's
// quantize_row_q6_K_ref, the sub-block fits from qx.go) and the level and
// scale lookup.

// q6Value returns the level (0..63) and the scale of weight i of a Q6_K
// super-block.
func q6Value(x []byte, i int) (int32, int8) {
	h, l := i/128, i%128
	ql, qh := x[64*h:], x[128+32*h:]
	quarter, p := l/32, l%32
	var lo byte
	switch quarter {
	case 0:
		lo = ql[p] & 15
	case 1:
		lo = ql[32+p] & 15
	case 2:
		lo = ql[p] >> 4
	case 3:
		lo = ql[32+p] >> 4
	}
	hi := qh[p] >> (2 * quarter) & 3
	return int32(lo) | int32(hi)<<4, int8(x[192+i/16])
}

// quantizeQ6K quantizes one super-block to Q6_K.
func quantizeQ6K(x []float32, y []byte) {
	x, y = x[:qk], y[:210]
	var fits [16]qxFit
	var maxScale, maxAbs float32
	for ib := range 16 {
		fits[ib] = makeQX((*[16]float32)(x[16*ib:]))
		s := fits[ib].scale
		if a := abs32(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	if maxAbs < 1e-15 {
		clear(y)
		return
	}
	iscale := -128 / maxScale
	d := putF16(y, 208, 1/iscale)
	for ib := range 16 {
		y[192+ib] = byte(int8(min(127, nearestInt(float32(iscale*fits[ib].scale)))))
	}
	var L [qk]int8
	for j := range 16 {
		xs, l := (*[16]float32)(x[16*j:]), (*[16]int8)(L[16*j:])
		dj := d * float32(int8(y[192+j]))
		if dj == 0 {
			fits[j].levels(xs, l)
			continue
		}
		for i, v := range xs {
			q := nearestInt(v / dj)
			l[i] = int8(max(-32, min(31, q)) + 32)
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
