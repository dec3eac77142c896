package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// This file holds the reference (de)quantization of the block dtypes: the
// algorithms of ggml's reference quantizers (quantize_row_*_ref, the path
// without an importance matrix), so that a file we quantize agrees with one
// llama.cpp makes from the same f32 weights, and the dequantization that
// defines what a block means. Everything is plain float32 arithmetic with
// no fused multiply-adds (a C compiler may contract some of llama.cpp's
// expressions, so agreement is close but not always bit-exact; see the
// tests for the bounds): every product that feeds a sum is converted to
// float32 explicitly, which forbids the fusion, so the bytes do not depend
// on GOAMD64 or the architecture.
//
// The quantizers run ggml's float32 operations in ggml's order, but their
// loops are arranged for speed (see qkx2State for Q4_K and Q5_K, makeQX for
// Q6_K); quant_ref_test.go keeps the straightforward port they replaced,
// to hold them to its bytes.

// qk is the number of weights in a K-quant super-block.
const qk = 256

// QuantizeRows quantizes the rows×cols row-major f32 matrix src to dtype d
// and returns the blocks, row after row (rows·RowBytes(cols) bytes). cols
// must be a multiple of the dtype's block (32 for Q8_0 and Q4_0, 256 for
// the K-quants), and src must hold rows·cols values.
//
//   - Q8_0: d = max|x|/127, q = round(x/d) (half away from zero).
//   - Q4_0: d = −m/8 where m is the value of largest magnitude, q =
//     min(15, trunc(x/d + 8.5)); Q5_0 likewise with −m/16 and 16.5.
//   - Q4_K, Q5_K: per sub-block of 32 a scale and min from ggml's
//     make_qkx2_quants search (weights av|x| + |x|, 20 and 15 steps), both
//     quantized to 6 bits against the largest, then the weights
//     re-quantized with the 6-bit values.
//   - Q6_K: per sub-block of 16 a scale from ggml's make_qx_quants search
//     (weights x²), quantized to int8 against the largest, then the
//     weights re-quantized.
func QuantizeRows(d DType, src []float32, rows, cols int) ([]byte, error) {
	if !d.Quantized() {
		return nil, fmt.Errorf("tensor: QuantizeRows to %s: not a quantized dtype", d)
	}
	if rows < 0 {
		return nil, fmt.Errorf("tensor: QuantizeRows with %d rows", rows)
	}
	rb, err := d.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	if len(src) < rows*cols {
		return nil, fmt.Errorf("tensor: QuantizeRows of %d×%d from %d values", rows, cols, len(src))
	}
	out := make([]byte, rows*rb)
	elems, bytes := d.BlockSize()
	for r := range rows {
		row := src[r*cols : (r+1)*cols]
		dst := out[r*rb : (r+1)*rb]
		for b := 0; b < cols/elems; b++ {
			x, y := row[b*elems:(b+1)*elems], dst[b*bytes:(b+1)*bytes]
			switch d {
			case Q8_0:
				quantizeQ8_0(x, y)
			case Q4_0:
				quantizeQ4_0(x, y)
			case Q5_0:
				quantizeQ5_0(x, y)
			case Q4_K:
				quantizeQ4K(x, y, false)
			case Q5_K:
				quantizeQ4K(x, y, true)
			case Q6_K:
				quantizeQ6K(x, y)
			}
		}
	}
	return out, nil
}

// DequantizeRow expands the blocks in src to len(dst) f32 weights: the
// exact reference meaning of each block (see the DType constants), in
// float32 arithmetic: Q8_0 q·d, Q4_0 (q−8)·d, Q5_0 (q−16)·d, Q4_K and Q5_K (d·scale)·q −
// dmin·min, Q6_K (d·scale)·(q−32). len(dst) must be a multiple of the
// dtype's block and src must hold that many blocks; DequantizeRow panics
// otherwise or if d is not quantized.
func DequantizeRow(d DType, src []byte, dst []float32) {
	if !d.Quantized() {
		panic(fmt.Sprintf("tensor: DequantizeRow of %s: not a quantized dtype", d))
	}
	rb, err := d.RowBytes(len(dst))
	if err != nil {
		panic(err.Error())
	}
	if len(src) < rb {
		panic(fmt.Sprintf("tensor: DequantizeRow of %d %s weights from %d bytes, want %d", len(dst), d, len(src), rb))
	}
	elems, bytes := d.BlockSize()
	for b := 0; b < len(dst)/elems; b++ {
		x, y := src[b*bytes:(b+1)*bytes], dst[b*elems:(b+1)*elems]
		switch d {
		case Q8_0:
			s := f16(x, 0)
			for i := range 32 {
				y[i] = float32(int8(x[2+i])) * s
			}
		case Q4_0:
			s := f16(x, 0)
			for i := range 16 {
				y[i] = float32(int32(x[2+i]&15)-8) * s
				y[16+i] = float32(int32(x[2+i]>>4)-8) * s
			}
		case Q5_0:
			s := f16(x, 0)
			for i := range 32 {
				y[i] = float32(q5_0Value(x, i)-16) * s
			}
		case Q4_K, Q5_K:
			dequantizeQ4K(d == Q5_K, x, y)
		case Q6_K:
			s := f16(x, 208)
			for i := range qk {
				q, sc := q6Value(x, i)
				y[i] = float32(s*float32(sc)) * float32(q-32)
			}
		}
	}
}

// f16 returns the f16 at b[off:] widened to f32.
func f16(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

// putF16 stores f rounded to f16 (nearest even) at b[off:] and returns the
// rounded value widened back.
func putF16(b []byte, off int, f float32) float32 {
	h := F32ToF16(f)
	binary.LittleEndian.PutUint16(b[off:], h)
	return F16ToF32(h)
}

// nearestInt rounds f to the nearest integer, ties to even, as ggml's
// nearest_int does (by adding 1.5·2²³). Outside ±2²² (where ggml's trick
// fails) it saturates instead.
func nearestInt(f float32) int32 {
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
		y[2+i] = byte(int8(t + half))
	}
}

// absMax returns the first value of largest magnitude in x and that
// magnitude, as a loop `if amax < |v| { amax, mx = |v|, v }` from 0 finds
// them, comparing the magnitudes' bit patterns as integers, which takes no
// branch. ok is false, and the results meaningless, if x holds a NaN.
func absMax(x []float32) (mx, amax float32, ok bool) {
	var ab, vb, nan uint32
	for _, v := range x {
		b := math.Float32bits(v)
		a := b &^ (1 << 31)
		nan |= (0x7f800000 - a) >> 31 // a > 0x7f800000
		if a > ab {
			ab, vb = a, b
		}
	}
	return math.Float32frombits(vb), math.Float32frombits(ab), nan == 0
}

// absMaxNaN is absMax for an x that holds a NaN, in order.
func absMaxNaN(x []float32) (mx, amax float32) {
	for _, v := range x {
		if amax < abs32(v) {
			amax, mx = abs32(v), v
		}
	}
	return mx, amax
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
		q0 := min(31, uint8(int8(float32(x[i]*id)+16.5)))
		q1 := min(31, uint8(int8(float32(x[16+i]*id)+16.5)))
		y[6+i] = q0&15 | (q1&15)<<4
		qh |= uint32(q0>>4) << i
		qh |= uint32(q1>>4) << (16 + i)
	}
	binary.LittleEndian.PutUint32(y[2:], qh)
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

// max32 is C's MAX(a, b): (a > b) ? a : b.
func max32(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

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
		q0 := min(15, uint8(int8(float32(x[i]*id)+8.5)))
		q1 := min(15, uint8(int8(float32(x[16+i]*id)+8.5)))
		y[2+i] = q0 | q1<<4
	}
}

// finite reports whether v is neither infinite nor NaN.
func finite(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

// roundMagic is what ggml's nearest_int adds, 1.5·2²³: for |f| < 2²² the
// float32 sum f + roundMagic is an integer in [2²³, 2²⁴), rounded to nearest
// even, so it is roundMagic + round(f), its bit pattern is 0x4b400000 +
// round(f), and (f + roundMagic) − roundMagic is round(f) exactly.
const roundMagic float32 = 12582912

// qkx2Fit is what make_qkx2_quants finds for a sub-block: the scale and
// −min, and the iscale and min that quantized the winning levels, from
// which levels recomputes them.
type qkx2Fit struct {
	scale, negMin float32
	iscale, mn    float32
}

// levels writes to l the levels of f's winning trial: what ggml's
// make_qkx2_quants leaves in L (quantizeQ4K needs them only for the
// sub-blocks whose 6-bit scale is 0; it re-quantizes the others).
func (f qkx2Fit) levels(nmax int32, x *[32]float32, l *[32]uint8) {
	for i := range 32 {
		l[i] = uint8(max(0, min(nmax, nearestInt(float32(f.iscale*(x[i]-f.mn))))))
	}
}

// qkx2Trial is one trial scale of make_qkx2_quants: its iscale, the
// levels' sums Σw·l, Σw·l², Σw·l·x, the least-squares scale and min (ok
// false if the system is singular) and their error.
type qkx2Trial struct {
	iscale             float32
	sumL, sumL2, sumXL float32
	scale, min         float32
	ok                 bool
	err                float32
}

// The phases of a qkx2State: its trial's levels and sums are to be
// computed, then its error, until the trials are done.
const (
	qkx2NeedSums = iota
	qkx2NeedErr
	qkx2Done
)

// qkx2LevelTables map the low 7 bits of p + roundMagic, which for
// −64.5 < p < 63.5 are nearestInt(p) in two's complement (those of
// 0x4b400000 are 0), to max(0, min(nmax, nearestInt(p))) for nmax 15 and
// 31: rounding and clamping a level with one addition and a load.
var qkx2LevelTables = [2][128]float32{qkx2LevelTable(15), qkx2LevelTable(31)}

func qkx2LevelTable(nmax int32) (t [128]float32) {
	for b := range t {
		t[b] = float32(max(0, min(nmax, int32(int8(b<<1))>>1)))
	}
	return t
}

// qkx2State is ggml's make_qkx2_quants under way on one sub-block of 32:
// it chooses a scale and a min (≤ 0) for x with levels 0..nmax, weighted
// by w, trying the range's scale and then nstep+1 scales around it, and
// fitting scale and min by weighted least squares at each.
//
// Every float32 operation is ggml's, in ggml's order; what changed is the
// work around them. A trial's cost is two chains of 32 dependent float
// additions, its sums and then its error, and each trial depends on the
// previous one (one that lowers the error moves the min that later trials
// quantize against). So qkx2Run takes two sub-blocks and alternates them
// in one loop (qkx2Step): one sub-block's error with the other's sums,
// which hides each chain's latency behind the other's work. A trial's
// levels are rounded and clamped in the same loop by a table lookup
// (qkx2LevelTables), the choice of the best trial takes no branch, whose
// mispredictions would discard the next step's work, and the winning
// levels are not kept (see qkx2Fit.levels).
type qkx2State struct {
	x            *[32]float32
	w, l         [32]float32   // the weights, the trial's levels
	levels       *[128]float32 // qkx2LevelTables for nmax
	nmax         int32
	rmin, rdelta float32
	nstep        int
	mn, mx, xmin float32 // the min trials quantize against (≤ 0), the largest and smallest x
	sumW, sumX   float32
	xFinite      bool // no infinity or NaN in x
	is           int  // the trial: −1 for the range's scale, then 0..nstep
	phase        int
	t            qkx2Trial
	bestErr      float32
	fit          qkx2Fit
}

// start sets s up for the sub-block x with Q4_K's weights av + |x|, where av
// is x's RMS, and levels 0..nmax (15 for Q4_K, 31 for Q5_K).
func (s *qkx2State) start(x *[32]float32, nmax int32, rmin, rdelta float32, nstep int) {
	var sumX2 float32
	var inf uint32
	for _, v := range x {
		sumX2 += float32(v * v)
		inf |= (math.Float32bits(v)>>23&0xff + 1) >> 8 // exponent 255
	}
	av := float32(math.Sqrt(float64(sumX2 / 32)))
	for i, v := range x {
		s.w[i] = av + abs32(v)
	}
	s.x, s.nmax, s.rmin, s.rdelta, s.nstep = x, nmax, rmin, rdelta, nstep
	s.levels = &qkx2LevelTables[0]
	if nmax == 31 {
		s.levels = &qkx2LevelTables[1]
	}
	w := &s.w
	mn, mx := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < 32; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	s.xmin = mn
	if mn > 0 {
		mn = 0
	}
	s.mn, s.mx, s.sumW, s.sumX, s.xFinite = mn, mx, sumW, sumX, inf == 0
	if mx == mn {
		s.fit, s.phase = qkx2Fit{negMin: -mn}, qkx2Done // iscale 0: all levels 0
		return
	}
	s.is, s.phase = -1, qkx2NeedSums
}

// begin sets up s's trial and reports whether its levels can be looked up
// in s.levels: whether no level can be NaN and every level is within
// −64..63 before clamping. The levels grow (or, for a negative iscale,
// shrink) with x, so all lie between those of x's smallest and largest
// values, and so do the differences x − mn: all are finite when those two
// are.
func (s *qkx2State) begin() bool {
	fmax := float32(s.nmax)
	iscale := fmax / (s.mx - s.mn)
	if s.is >= 0 {
		iscale = (s.rmin + float32(s.rdelta*float32(s.is)) + fmax) / (s.mx - s.mn)
	}
	s.t = qkx2Trial{iscale: iscale}
	lo, hi := s.xmin-s.mn, s.mx-s.mn
	if !s.xFinite || !finite(lo) || !finite(hi) || !finite(iscale) {
		return false
	}
	qlo, qhi := nearestInt(float32(iscale*lo)), nearestInt(float32(iscale*hi))
	return -64 <= min(qlo, qhi) && max(qlo, qhi) <= 63
}

// sums computes s's trial's levels and sums, and fits its scale and min.
func (s *qkx2State) sums() {
	lookup := s.begin()
	l, x, w := s.l[:], s.x[:], s.w[:]
	iscale, mn, nmax, levels := s.t.iscale, s.mn, s.nmax, s.levels
	for i := range 32 {
		p := float32(iscale * (x[i] - mn))
		if lookup {
			l[i] = levels[math.Float32bits(p+roundMagic)&127]
		} else {
			l[i] = float32(max(0, min(nmax, nearestInt(p))))
		}
	}
	var sumL, sumL2, sumXL float32
	for i := range 32 {
		wl := float32(w[i] * l[i])
		sumL += wl
		sumL2 += float32(wl * l[i])
		sumXL += float32(wl * x[i])
	}
	s.t.sumL, s.t.sumL2, s.t.sumXL = sumL, sumL2, sumXL
	s.solve()
}

// solve fits the scale and min of s's trial from its sums, as
// make_qkx2_quants does (the range's trial takes 1/iscale and the min).
func (s *qkx2State) solve() {
	t := &s.t
	s.phase = qkx2NeedErr
	if s.is < 0 {
		t.scale, t.min, t.ok = 1/t.iscale, s.mn, true
		return
	}
	D := float32(s.sumW*t.sumL2) - float32(t.sumL*t.sumL)
	if t.ok = D > 0; !t.ok {
		return
	}
	t.scale = (float32(s.sumW*t.sumXL) - float32(s.sumX*t.sumL)) / D
	t.min = (float32(t.sumL2*s.sumX) - float32(t.sumL*t.sumXL)) / D
	if t.min > 0 {
		t.min = 0
		t.scale = t.sumXL / t.sumL2
	}
}

// err computes the error of s's trial and decides it.
func (s *qkx2State) err() {
	l, x, w := s.l[:], s.x[:], s.w[:]
	scale, mn := s.t.scale, s.t.min
	var e float32
	for i := range 32 {
		diff := float32(scale*l[i]) + mn - x[i]
		e += float32(w[i] * float32(diff*diff))
	}
	s.t.err = e
	s.decide()
}

// decide keeps s's trial if it is the range's or lowers the error (the
// range's trial's min is s.mn), and moves on to the next trial.
func (s *qkx2State) decide() {
	t := &s.t
	keep := mask(s.is < 0) | mask(t.ok)&mask(t.err < s.bestErr)
	s.bestErr = pick(keep, s.bestErr, t.err)
	s.fit.scale = pick(keep, s.fit.scale, t.scale)
	s.fit.iscale = pick(keep, s.fit.iscale, t.iscale)
	s.fit.mn = pick(keep, s.fit.mn, s.mn)
	s.mn = pick(keep, s.mn, t.min)
	s.is++
	s.phase = qkx2NeedSums
	if s.is > s.nstep {
		s.fit.negMin = -s.mn
		s.phase = qkx2Done
	}
}

// mask returns all ones for true and 0 for false, without a branch.
func mask(b bool) uint32 {
	var m uint32
	if b {
		m = ^m
	}
	return m
}

// pick returns b where m is all ones and a where it is 0, without a
// branch (the compiler has no conditional move for floats).
func pick(m uint32, a, b float32) float32 {
	ab := math.Float32bits(a)
	return math.Float32frombits(ab ^ (ab^math.Float32bits(b))&m)
}

// qkx2Run runs make_qkx2_quants on the sub-blocks a and b to the end,
// alternating them through qkx2Step while both have trials left.
func qkx2Run(a, b *qkx2State) {
	for {
		switch {
		case a.phase == qkx2NeedErr && b.phase == qkx2NeedSums:
			qkx2Step(a, b)
		case b.phase == qkx2NeedErr && a.phase == qkx2NeedSums:
			qkx2Step(b, a)
		case a.phase == qkx2NeedSums:
			a.sums()
		case b.phase == qkx2NeedSums:
			b.sums()
		case a.phase == qkx2NeedErr:
			a.err()
		case b.phase == qkx2NeedErr:
			b.err()
		default:
			return
		}
	}
}

// qkx2Step computes e's error and s's levels and sums in one loop (see
// qkx2State), then decides e's trial and fits s's.
func qkx2Step(e, s *qkx2State) {
	if !s.begin() {
		e.err()
		s.sums()
		return
	}
	qkx2Fused(e, s, roundMagic)
	e.decide()
	s.solve()
}

// qkx2Fused is qkx2Step's loop, for levels looked up in s.levels. magic is
// roundMagic, passed in so that the compiler keeps it in a register rather
// than loading it from memory for every weight.
func qkx2Fused(e, s *qkx2State, magic float32) {
	el, ex, ew := e.l[:], e.x[:], e.w[:]
	sl, sx, sw := s.l[:], s.x[:], s.w[:]
	scale, mn := e.t.scale, e.t.min
	iscale, smn, levels := s.t.iscale, s.mn, s.levels
	var errSum, sumL, sumL2, sumXL float32
	for i := range 32 {
		diff := float32(scale*el[i]) + mn - ex[i]
		errSum += float32(ew[i] * float32(diff*diff))
		xv := sx[i]
		fl := levels[math.Float32bits(float32(iscale*(xv-smn))+magic)&127]
		sl[i] = fl
		wl := float32(sw[i] * fl)
		sumL += wl
		sumL2 += float32(wl * fl)
		sumXL += float32(wl * xv)
	}
	e.t.err = errSum
	s.t.sumL, s.t.sumL2, s.t.sumXL = sumL, sumL2, sumXL
}

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
