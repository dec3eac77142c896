package tensor

import "math"

// ggml's make_qkx2_quants, the search for a Q4_K/Q5_K sub-block's scale and
// min, in ggml's float32 operations and order but arranged for speed: two
// sub-blocks run interleaved through qkx2State's phases, so that one's
// error and the other's levels are computed in one loop.

// finite reports whether v is neither infinite nor NaN.
func finite(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

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
