package tensor

import "math"

// ggml's make_qx_quants for the Q6_K sub-blocks of 16: the scale search,
// in ggml's float32 operations and order, with the levels rounded and
// clamped by a table lookup and two trial scales summed per loop.

// qxFit is what makeQX finds for a sub-block: the scale, and the iscale
// that quantized the winning levels, from which levels recomputes them
// (zero: all levels 0, for a sub-block too small to fit).
type qxFit struct {
	scale, iscale float32
	zero          bool
}

// levels writes to l the levels of f's winning trial, offset by 32: what
// ggml's make_qx_quants leaves in L (quantizeQ6K needs them only for the
// sub-blocks whose int8 scale is 0; it re-quantizes the others).
func (f qxFit) levels(x *[16]float32, l *[16]int8) {
	if f.zero {
		clear(l[:])
		return
	}
	for i, v := range x {
		l[i] = int8(max(-32, min(31, nearestInt(float32(f.iscale*v)))) + 32)
	}
}

// qxTrials is the number of scales makeQX tries: ggml's first guess and 18
// around it.
const qxTrials = 19

// qxLevelTable maps the low 7 bits of p + roundMagic (see qkx2LevelTables)
// to max(−32, min(31, nearestInt(p))): makeQX's rounding and clamping with
// one addition and a load.
var qxLevelTable = func() (t [128]float32) {
	for b := range t {
		t[b] = float32(max(-32, min(31, int32(int8(b<<1))>>1)))
	}
	return t
}()

// makeQX is ggml's make_qx_quants with nmax 32, rmse_type 1 and no
// importance weights for a sub-block of 16: the scale for x with levels
// −32..31 (stored as l+32) that maximises the x²-weighted fit over 19 trial
// scales.
//
// Every float32 operation is ggml's, in ggml's order, but the trials are
// independent (only the choice among them runs in order), so their sums
// are computed first, two trials per loop (qxSums2) from x² and x³
// computed once, and then compared in ggml's order. Unless x holds an
// infinity or NaN, every trial's |iscale·x| is at most 32.9 and the levels
// are rounded and clamped by qxLevelTable. The winning levels are not kept
// (see qxFit.levels).
func makeQX(x *[16]float32) qxFit {
	// The value of largest magnitude, the first if several: for finite x
	// by comparing magnitudes' bit patterns as integers, without branches.
	var inf, amaxBits, mxBits uint32
	for _, v := range x {
		b := math.Float32bits(v)
		inf |= (b>>23&0xff + 1) >> 8 // exponent 255
		if a := b &^ (1 << 31); a > amaxBits {
			amaxBits, mxBits = a, b
		}
	}
	amax, mx := math.Float32frombits(amaxBits), math.Float32frombits(mxBits)
	if inf != 0 {
		amax, mx = 0, 0
		for _, v := range x {
			if ax := abs32(v); ax > amax {
				amax, mx = ax, v
			}
		}
	}
	if amax < 1e-15 {
		return qxFit{zero: true}
	}
	const nmax = 32
	var iscales [qxTrials + 1]float32 // and a copy of the last, to pair
	iscales[0] = -nmax / mx
	for t, is := 1, -9; is <= 9; is++ {
		if is != 0 {
			iscales[t] = -(nmax + float32(0.1*float32(is))) / mx
			t++
		}
	}
	iscales[qxTrials] = iscales[qxTrials-1]
	var w, wx [16]float32 // x², x³
	for i, v := range x {
		w[i] = v * v
		wx[i] = float32(w[i] * v)
	}
	var sumLX, sumL2 [qxTrials + 1]float32
	for t := 0; t < qxTrials; t += 2 {
		if inf == 0 {
			sumLX[t], sumL2[t], sumLX[t+1], sumL2[t+1] = qxSums2(x, &w, &wx, iscales[t], iscales[t+1], roundMagic, &qxLevelTable)
			continue
		}
		for k := t; k < t+2; k++ {
			var lx, l2 float32
			for i, v := range x {
				fl := float32(max(-nmax, min(nmax-1, nearestInt(float32(iscales[k]*v)))))
				lx += float32(wx[i] * fl)
				l2 += float32(float32(w[i]*fl) * fl)
			}
			sumLX[k], sumL2[k] = lx, l2
		}
	}
	var scale float32
	if sumL2[0] != 0 {
		scale = sumLX[0] / sumL2[0]
	}
	best, bestT := scale*sumLX[0], 0
	for t := 1; t < qxTrials; t++ {
		if sumL2[t] > 0 && float32(sumLX[t]*sumLX[t]) > float32(best*sumL2[t]) {
			scale = sumLX[t] / sumL2[t]
			best, bestT = scale*sumLX[t], t
		}
	}
	return qxFit{scale: scale, iscale: iscales[bestT]}
}

// qxSums2 returns make_qx_quants's Σx³·l and Σx²·l², summed in order, for
// the levels of the finite x at the trial scales ia and ib. magic and
// levels are roundMagic and qxLevelTable, passed in so that the compiler
// keeps them in registers rather than loading them for every weight.
func qxSums2(x, w, wx *[16]float32, ia, ib, magic float32, levels *[128]float32) (lxa, l2a, lxb, l2b float32) {
	xs, ws, wxs := x[:], w[:], wx[:]
	for i := range 16 {
		v, w, wx := xs[i], ws[i], wxs[i]
		fa := levels[math.Float32bits(float32(ia*v)+magic)&127]
		fb := levels[math.Float32bits(float32(ib*v)+magic)&127]
		lxa += float32(wx * fa)
		lxb += float32(wx * fb)
		l2a += float32(float32(w*fa) * fa)
		l2b += float32(float32(w*fb) * fb)
	}
	return lxa, l2a, lxb, l2b
}
