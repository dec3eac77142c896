package tensor

import (
	"fmt"
	"math"
	"sync"
)

// The matrix product with quantized weights. The activations are quantized
// first, the way llama.cpp does for each weight type: per 32-block to q8_0
// (f16 scale d = max|x|/127, q = round(x/d)) for Q8_0, Q4_0 and Q5_0
// weights, per 256-block to q8_K (f32 scale, q = nearest(127·x/m) for the
// value m of largest magnitude, and sums of q per 16) for the K-quants.
//
// Every output element is then defined as one fixed sequence of operations,
// the same on every ISA and whatever the batch (so results are batch
// invariant and even ISA independent): over the weight row's blocks b in
// order, with acc = +0 to start,
//
//   - Q8_0, Q4_0, Q5_0: acc = fma(float32(I_b), dw_b·dx_b, acc), where I_b
//     is the exact integer dot product of the block's levels (Q4_0: q−8,
//     Q5_0: q−16) and the activation's int8 values, dw_b the weight's
//     scale and dx_b the activation's (both f16 widened), their product
//     rounded to f32;
//   - Q4_K, Q5_K: acc = fma(float32(I_b), d_b·dy_b, acc), then acc =
//     fma(−float32(M_b), dmin_b·dy_b, acc), where I_b = Σ_j scale_j·Σ q·x
//     over the 8 sub-blocks j (exact) and M_b = Σ_j min_j·Σ x (exact);
//   - Q6_K: acc = fma(float32(I_b), d_b·dy_b, acc), with I_b = Σ_s
//     scale_s·Σ (q−32)·x over the 16 sub-blocks s (exact).
//
// fma is the fused multiply-add (one rounding) and float32(·) rounds to
// nearest even. The integer sums are exact in int32 for every input, so the
// kernels are free to compute them in any order.

// qAct holds activations quantized for a quantized matrix product.
type qAct struct {
	dt   DType
	m, k int
	// xq holds the m×k int8 levels, row after row.
	xq []int8
	// meta holds per-block records, row after row: for the 32-blocks of
	// Q8_0, Q4_0 and Q5_0 weights two words per block, the f32 scale dx
	// (f16 widened) and the int32 correction the VNNI kernels add for
	// their unsigned weight levels (−128·Σq for Q8_0, −8·Σq for Q4_0,
	// −16·Σq for Q5_0); for the K-quants 16 words (64 bytes) per
	// 256-block: word 0 the f32 scale, words 4..7 the 8 int16 sums of q
	// per 32, words 8..15 the 16 int16 sums of q per 16 (little-endian
	// pairs), the other words zero.
	meta []uint32
	// rowAux holds, for one activation row, the per-block arrays of the
	// row kernels (set by setRowAux): for the 32-blocks the nb scales dx
	// then the nb corrections, for the K-quants the nb scales, for
	// Q4_K/Q5_K then 8 words per super-block: the int16 sums of q per 32
	// laid out like the AVX-512 row kernel's scale and min words (words
	// 4..7 and 12..15 the sums of sub-blocks 0..3 and 4..7, the rest
	// zero).
	rowAux []uint32
	// amxRows and amxMeta are, for a product the AMX kernels run, the
	// first m/16·16 rows and their records arranged for those kernels
	// (prepareAMX); amxRows is 0 otherwise.
	amxRows int
	amxMeta []uint32
	// rowX holds, for one activation row of Q4_K/Q5_K weights, the
	// levels with the 32-byte sub-blocks of each super-block in the order
	// 0, 2, 1, 3, 4, 6, 5, 7 (asmgen's q4kPerm: a 512-bit vector of the
	// AVX-512 row kernel holds two sub-blocks' nibbles); for Q4_0 and
	// Q5_0 weights whose row has a multiple of 4 blocks, per 4 blocks
	// the first 16 levels of each block, then the last 16 of each (a
	// 512-bit vector of the VBMI row kernels holds 4 blocks' nibble
	// bytes: their low nibbles are weights 0..15, the high ones 16..31).
	rowX []int8
}

// setRowAux fills a.rowAux and a.rowX from a.meta and a.xq (one activation
// row): the layouts the row kernels read with plain vector loads.
func (a *qAct) setRowAux() {
	words, elems := metaWords(a.dt)
	nb := a.k / elems
	n := nb
	kmins := a.dt == Q4_K || a.dt == Q5_K
	switch {
	case words == 2:
		n = 2 * nb
	case kmins:
		n = 9 * nb
	}
	if cap(a.rowAux) < n {
		a.rowAux = make([]uint32, n)
	}
	a.rowAux = a.rowAux[:n]
	for b := range nb {
		a.rowAux[b] = a.meta[b*words]
		if words == 2 {
			a.rowAux[nb+b] = a.meta[2*b+1]
		}
		if kmins {
			s := a.rowAux[nb+8*b : nb+8*b+8]
			m := a.meta[16*b+4 : 16*b+8]
			s[0], s[1], s[2], s[3] = 0, 0, m[0], m[1]
			s[4], s[5], s[6], s[7] = 0, 0, m[2], m[3]
		}
	}
	switch {
	case a.dt == Q4_K || a.dt == Q5_K:
		a.growRowX()
		for b := range nb {
			for i, j := range [8]int{0, 2, 1, 3, 4, 6, 5, 7} {
				copy(a.rowX[qk*b+32*i:qk*b+32*i+32], a.xq[qk*b+32*j:qk*b+32*j+32])
			}
		}
	case (a.dt == Q4_0 || a.dt == Q5_0) && nb%4 == 0 && quadRows:
		a.growRowX()
		for c := 0; c < a.k; c += 128 {
			for q := range 4 {
				copy(a.rowX[c+16*q:c+16*q+16], a.xq[c+32*q:c+32*q+16])
				copy(a.rowX[c+64+16*q:c+64+16*q+16], a.xq[c+32*q+16:c+32*q+32])
			}
		}
	}
}

// quadRows reports that a row kernel of this CPU takes Q4_0/Q5_0
// activations in qAct.rowX's order (qRowKernel.quad), so setRowAux lays
// them out only where one will read them.
var quadRows bool

// growRowX sizes a.rowX to a.k levels.
func (a *qAct) growRowX() {
	if cap(a.rowX) < a.k {
		a.rowX = make([]int8, a.k)
	}
	a.rowX = a.rowX[:a.k]
}

// metaWords returns the number of meta words per block of activations for
// weights of dtype d, and the block's element count.
func metaWords(d DType) (words, elems int) {
	if d == Q8_0 || d == Q4_0 || d == Q5_0 {
		return 2, 32
	}
	return 16, qk
}

// qActs recycles activation buffers.
var qActs = sync.Pool{New: func() any { return new(qAct) }}

// quantizeActs quantizes the m×k activations x for weights of dtype dt
// into a, sized to fit, splitting rows across the pool.
func (p *Pool) quantizeActs(ks *kernelSet, a *qAct, dt DType, x []float32, m, k int) {
	words, elems := metaWords(dt)
	nb := k / elems
	a.dt, a.m, a.k = dt, m, k
	if cap(a.xq) < m*k {
		a.xq = make([]int8, m*k)
	}
	a.xq = a.xq[:m*k]
	if cap(a.meta) < m*nb*words {
		a.meta = make([]uint32, m*nb*words)
	}
	a.meta = a.meta[:m*nb*words]
	rows := func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xs, q, meta := x[r*k:(r+1)*k], a.xq[r*k:(r+1)*k], a.meta[r*nb*words:(r+1)*nb*words]
			switch {
			case nb == 0:
				continue
			case elems == 32 && ks.qactQ8_0 != nil:
				corr := qCorrection(dt)
				ks.qactQ8_0(&xs[0], nb, &q[0], &meta[0], corr)
				continue
			case elems == qk && ks.qactQ8K != nil:
				ks.qactQ8K(&xs[0], nb, &q[0], &meta[0])
				continue
			}
			for b := range nb {
				if elems == 32 {
					quantizeActQ8_0(dt, xs[32*b:32*b+32], q[32*b:32*b+32], meta[2*b:2*b+2])
				} else {
					quantizeActQ8K(xs[qk*b:qk*b+qk], q[qk*b:qk*b+qk], meta[16*b:16*b+16])
				}
			}
		}
	}
	if m*k < 1<<14 || p.threads == 1 {
		rows(0, m)
		return
	}
	p.Parallel(m, rows)
}

// quantizeActQ8_0 is ggml's quantize_row_q8_0_ref for one block.
func quantizeActQ8_0(dt DType, x []float32, q []int8, meta []uint32) {
	var amax float32
	for _, v := range x {
		amax = max32(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	var sum int32
	for i, v := range x {
		q[i] = int8(math.Round(float64(v * id)))
		sum += int32(q[i])
	}
	meta[0] = math.Float32bits(F16ToF32(F32ToF16(d)))
	meta[1] = uint32(int32(qCorrection(dt)) * sum)
}

// qCorrection is the factor of Σq in the correction of the 32-block
// activations for weights of dtype dt: minus the offset of the VNNI
// kernels' unsigned levels.
func qCorrection(dt DType) int {
	switch dt {
	case Q4_0:
		return -8
	case Q5_0:
		return -16
	}
	return -128
}

// quantizeActQ8K is ggml's quantize_row_q8_K_ref for one block.
func quantizeActQ8K(x []float32, q []int8, meta []uint32) {
	clear(meta)
	var mx, amax float32
	for _, v := range x {
		if ax := abs32(v); ax > amax {
			amax, mx = ax, v
		}
	}
	if amax == 0 {
		clear(q)
		return
	}
	iscale := -127 / mx
	for i, v := range x {
		q[i] = int8(min(127, nearestInt(iscale*v)))
	}
	meta[0] = math.Float32bits(1 / iscale)
	for g := range 16 {
		var s int32
		for _, v := range q[16*g : 16*g+16] {
			s += int32(v)
		}
		setHalf(meta[8:], g, s)
		if g%2 == 1 {
			setHalf(meta[4:], g/2, s+int32(int16(meta[8+(g-1)/2])))
		}
	}
}

// setHalf stores v as the int16 number i of the little-endian pairs in w.
func setHalf(w []uint32, i int, v int32) {
	sh := 16 * (i % 2)
	w[i/2] = w[i/2]&^(0xffff<<sh) | uint32(uint16(int16(v)))<<sh
}

// half returns int16 number i of the little-endian pairs in w.
func half(w []uint32, i int) int32 { return int32(int16(w[i/2] >> (16 * (i % 2)))) }

// matmulQuant is MatMul for quantized weights.
func (p *Pool) matmulQuant(ks *kernelSet, out, x []float32, m int, w *Mat) {
	n, k := w.Rows, w.Cols
	a := qActs.Get().(*qAct)
	defer qActs.Put(a)
	p.quantizeActs(ks, a, w.DType, x, m, k)
	a.amxRows = 0
	if ks.amx {
		a.prepareAMX()
	}
	if m == 1 && !w.Panels {
		a.setRowAux() // for the row kernels
	}
	chunk := n
	if p.threads > 1 && m*n*k >= serialFMAs {
		per := chunksPerThread
		if m == 1 {
			per = rowChunksPerThread
		}
		chunk = (n + p.threads*per - 1) / (p.threads * per)
		chunk = (chunk + chunkAlign - 1) / chunkAlign * chunkAlign
	}
	qmm := ks.qmm
	switch f := ks.qmmRow[w.DType]; {
	case w.Panels:
		// Stored as panels only where the panel kernels run; their bits
		// are every quantized kernel's.
		qmm = qmmPanels
		if ks.amx {
			qmm = qmmPanelsAMX
		}
	case m == 1 && f != nil:
		qmm = f
	case qmm == nil:
		qmm = qmmGo
	}
	p.run(n, chunk, func(_, lo, hi int) { qmm(a, w, lo, hi, out) })
}

// checkQuant panics unless w's blocks cover its shape.
func checkQuant(w *Mat) {
	rb, err := w.DType.RowBytes(w.Cols)
	if err != nil {
		panic(fmt.Sprintf("tensor: MatMul %v", err))
	}
	if len(w.Q) < w.Rows*rb {
		panic(fmt.Sprintf("tensor: MatMul %s weights have %d bytes, want rows×%d = %d×%d", w.DType, len(w.Q), rb, w.Rows, rb))
	}
}

// qmmGo is the pure-Go quantized kernel: out[i*Rows+j] for i < m and lo ≤
// j < hi, each by the definition above.
func qmmGo(a *qAct, w *Mat, lo, hi int, out []float32) {
	n := w.Rows
	rb, _ := w.DType.RowBytes(w.Cols)
	for j := lo; j < hi; j++ {
		row := w.Q[j*rb : (j+1)*rb]
		for i := range a.m {
			out[i*n+j] = qdotGo(a, i, row)
		}
	}
}

// qdotGo returns the product of activation row i of a with the weight row
// of blocks wr, by the definition above.
func qdotGo(a *qAct, i int, wr []byte) float32 {
	words, elems := metaWords(a.dt)
	_, bytes := a.dt.BlockSize()
	nb := a.k / elems
	xq := a.xq[i*a.k : (i+1)*a.k]
	meta := a.meta[i*nb*words : (i+1)*nb*words]
	var acc float32
	for b := range nb {
		blk := wr[b*bytes : (b+1)*bytes]
		x := xq[b*elems : (b+1)*elems]
		mb := meta[b*words : (b+1)*words]
		dx := math.Float32frombits(mb[0])
		switch a.dt {
		case Q8_0:
			var s int32
			for t, v := range x {
				s += int32(int8(blk[2+t])) * int32(v)
			}
			acc = fma32(float32(s), f16(blk, 0)*dx, acc)
		case Q4_0:
			var s int32
			for t := range 16 {
				s += (int32(blk[2+t]&15) - 8) * int32(x[t])
				s += (int32(blk[2+t]>>4) - 8) * int32(x[16+t])
			}
			acc = fma32(float32(s), f16(blk, 0)*dx, acc)
		case Q5_0:
			var s int32
			for t, v := range x {
				s += (q5_0Value(blk, t) - 16) * int32(v)
			}
			acc = fma32(float32(s), f16(blk, 0)*dx, acc)
		case Q4_K, Q5_K:
			five := a.dt == Q5_K
			var is, ms int32
			for j := range 8 {
				sc, mn := scaleMinK4(blk[4:16], j)
				var s int32
				for t := range 32 {
					s += q4KValue(five, blk, 32*j+t) * int32(x[32*j+t])
				}
				is += int32(sc) * s
				ms += int32(mn) * half(mb[4:8], j)
			}
			acc = fma32(float32(is), f16(blk, 0)*dx, acc)
			acc = fma32(-float32(ms), f16(blk, 2)*dx, acc)
		case Q6_K:
			var is int32
			for s := range 16 {
				var d int32
				var sc int8
				for t := range 16 {
					q, c := q6Value(blk, 16*s+t)
					d += (q - 32) * int32(x[16*s+t])
					sc = c
				}
				is += int32(sc) * d
			}
			acc = fma32(float32(is), f16(blk, 208)*dx, acc)
		}
	}
	return acc
}

// fma32 returns a·b+c rounded once to float32 (what VFMADD231PS computes).
// The product is exact in float64; the float64 sum is rounded once, and
// when it lands exactly on a float32 tie the residual decides the side.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	r := float32(s)
	if float64(r) == s || math.IsInf(s, 0) || s != s {
		return r
	}
	// TwoSum: the exact p+c is s+e.
	bb := s - p
	e := (p - (s - bb)) + (float64(c) - bb)
	if e == 0 {
		return r
	}
	other := math.Nextafter32(r, float32(math.Copysign(math.Inf(1), s-float64(r))))
	if (float64(r)+float64(other))/2 != s {
		return r // not a tie: the first rounding decided correctly
	}
	if (e > 0) == (float64(other) > float64(r)) {
		return other
	}
	return r
}
