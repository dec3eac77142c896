package tensor

import (
	"math"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The arm64 kernel set "neon": the f32, bf16 and f16 matrix products as one
// NEON dot product per output (kernels_arm64.s), each with the accumulation
// structure dotNEONRef defines, so every output is the same sum whatever
// the batch; attention's value sums (axpy over rows, axpyGo's rounding) and
// the logits' arg max in NEON too. ASIMD is part of every arm64 CPU;
// whether this set or the pure-Go one runs is the calibration's choice on
// the machine itself. Its quantized products are the "neondot" kernels
// (every quantized format, with SDOT) where the CPU has them, the pure-Go
// ones otherwise, as are the other element-wise kernels.

// dotF32NEON returns Σ x[t]·w[t] over t < n in the set's order.
//
//go:noescape
func dotF32NEON(x, w *float32, n int) float32

// dotBF16NEON is dotF32NEON with bf16 weights, widened exactly.
//
//go:noescape
func dotBF16NEON(x *float32, w *uint16, n int) float32

// dotF16NEON is dotF32NEON with f16 weights, widened exactly (FCVTL).
//
//go:noescape
func dotF16NEON(x *float32, w *uint16, n int) float32

// axpyRowsNEON and axpyRowsBF16NEON are the value sums of axpyRows and
// axpyRowsBF16 over n columns, n a multiple of 16.
//
//go:noescape
func axpyRowsNEON(alpha, v *float32, ldv, rows int, y *float32, n int)

//go:noescape
func axpyRowsBF16NEON(alpha *float32, v *uint16, ldv, rows int, y *float32, n int)

// axpyRowsBF16G2NEON, G3 and G4 are axpyRowsBF16G's for 2, 3 and 4 outputs
// over n columns, n a multiple of 8, rows at least 1.
//
//go:noescape
func axpyRowsBF16G2NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)

//go:noescape
func axpyRowsBF16G3NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)

//go:noescape
func axpyRowsBF16G4NEON(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int)

// firstAboveNEON returns the first of x's blocks of 16 that holds an
// element above bv (NaN never is), or blocks if none does.
//
//go:noescape
func firstAboveNEON(x *float32, blocks int, bv float32) int

// archKernelSets returns the arm64 kernel set.
func archKernelSets() []*kernelSet { return []*kernelSet{neonSet()} }

// archQuantKernels returns arm64's assembly quantized kernels: "neondot"
// where the CPU has the dot product instructions (ARMv8.2; Graviton2 and
// later, Neoverse, Apple M).
func archQuantKernels() []quantKernel {
	return []quantKernel{{name: "neondot", fn: qmmNEONDot, avail: cpu.ARM64.HasASIMDDP}}
}

func prefetch(p uintptr, ld, rows, lines int) {}

// neonSet is the "neon" kernel set.
func neonSet() *kernelSet {
	ks := &kernelSet{name: "neon", qmmName: "go", cols: 1, avail: true,
		dot: dotF32NEON, axpy: axpyGoPtr, silu: siluGoPtr, expSum: expSumGoPtr}
	ks.axpyRows = func(alpha, v *float32, ldv, rows int, y *float32, n int) {
		n16 := n &^ 15
		axpyRowsNEON(alpha, v, ldv, rows, y, n16)
		axpyRowsTail(alpha, v, ldv, rows, y, n16, n, func(f float32) float32 { return f })
	}
	ks.axpyRowsBF16 = func(alpha *float32, v *uint16, ldv, rows int, y *float32, n int) {
		n16 := n &^ 15
		axpyRowsBF16NEON(alpha, v, ldv, rows, y, n16)
		axpyRowsTail(alpha, v, ldv, rows, y, n16, n, BF16ToF32)
	}
	for g, kernel := range []func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int){
		axpyRowsBF16G2NEON, axpyRowsBF16G3NEON, axpyRowsBF16G4NEON,
	} {
		ks.axpyRowsBF16G[g] = func(alpha *float32, lda int, v *uint16, ldv, rows int, y *float32, ldy, n int) {
			n8 := n &^ 7
			kernel(alpha, lda, v, ldv, rows, y, ldy, n8)
			for h := range g + 2 {
				a := (*float32)(unsafe.Add(unsafe.Pointer(alpha), h*lda*4))
				yh := (*float32)(unsafe.Add(unsafe.Pointer(y), h*ldy*4))
				axpyRowsTail(a, v, ldv, rows, yh, n8, n, BF16ToF32)
			}
		}
	}
	ks.argMax = argMaxNEON
	if cpu.ARM64.HasASIMDDP {
		ks.qmm, ks.qmmName = qmmNEONDot, "neondot"
	}
	for r := range maxTileRows {
		ks.f32[r] = dotGemm(r+1, dotF32NEON)
		ks.bf16[r] = dotGemm(r+1, dotBF16NEON)
		ks.f16[r] = dotGemm(r+1, dotF16NEON)
	}
	return ks
}

// dotGemm returns a matrix kernel for rows x rows that computes each output
// with one call of dot, weight row by weight row (the rows share it while
// it is in the L1).
func dotGemm[W float32 | uint16](rows int, dot func(x *float32, w *W, n int) float32) func(x *float32, ldx int, w *W, ldw, k, n int, out *float32, ldo int, _ uintptr) {
	return func(x *float32, ldx int, w *W, ldw, k, n int, out *float32, ldo int, _ uintptr) {
		var zero W
		wsize := int(unsafe.Sizeof(zero))
		for j := range n {
			wj := (*W)(unsafe.Add(unsafe.Pointer(w), j*ldw*wsize))
			for i := range rows {
				xi := (*float32)(unsafe.Add(unsafe.Pointer(x), i*ldx*4))
				*(*float32)(unsafe.Add(unsafe.Pointer(out), (i*ldo+j)*4)) = dot(xi, wj, k)
			}
		}
	}
}

// axpyRowsTail is the value sums of columns [t0,t1) in Go: y[t] +=
// alpha[r]·widen(v[r·ldv+t]) for each row in order, the product rounded
// first, as the NEON kernels and axpyGo do.
func axpyRowsTail[W float32 | uint16](alpha *float32, v *W, ldv, rows int, y *float32, t0, t1 int, widen func(W) float32) {
	if t0 == t1 || rows == 0 {
		return
	}
	as, ys := unsafe.Slice(alpha, rows), unsafe.Slice(y, t1)
	vs := unsafe.Slice(v, (rows-1)*ldv+t1)
	for t := t0; t < t1; t++ {
		s := ys[t]
		for r, a := range as {
			s += float32(a * widen(vs[r*ldv+t]))
		}
		ys[t] = s
	}
}

// argMaxNEON is argMaxGo with NEON testing the blocks of 16: the same
// blocks scanned, in the same order, so the same index.
func argMaxNEON(x *float32, n int) int {
	xs := unsafe.Slice(x, n)
	best, bv := 0, float32(math.Inf(-1))
	i := 0
	for blocks := n / 16; i < 16*blocks; i += 16 {
		i += 16 * firstAboveNEON(&xs[i], blocks-i/16, bv)
		if i == 16*blocks {
			break
		}
		for j, v := range xs[i : i+16] {
			if v > bv {
				best, bv = i+j, v
			}
		}
	}
	for ; i < n; i++ {
		if xs[i] > bv {
			best, bv = i, xs[i]
		}
	}
	return best
}

// qdotQ8_0x4NEON, qdotQ4_0x4NEON and qdotQ5_0x4NEON compute, by qdotGo's
// definition, the products of the nb blocks of int8 activation levels x
// (records meta) with four weight rows of Q8_0, Q4_0 or Q5_0 blocks rb
// bytes apart from w, into
// out[0..3]. They need ARMv8.2's dot product.
//
//go:noescape
func qdotQ8_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)

//go:noescape
func qdotQ4_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)

//go:noescape
func qdotQ5_0x4NEON(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)

// qdotQ4KNEON returns, by qdotGo's definition, the product of the nb
// super-blocks of int8 activation levels x (records meta) with the Q4_K
// weight row w. It needs ARMv8.2's dot product.
//
//go:noescape
func qdotQ4KNEON(x *int8, meta *uint32, w *byte, nb int) float32

// qdotQ5KNEON is qdotQ4KNEON for a Q5_K weight row.
//
//go:noescape
func qdotQ5KNEON(x *int8, meta *uint32, w *byte, nb int) float32

// qdotQ6KNEON is qdotQ4KNEON for a Q6_K weight row.
//
//go:noescape
func qdotQ6KNEON(x *int8, meta *uint32, w *byte, nb int) float32

// qmmNEONDot is the "neondot" quantized kernel: Q8_0, Q4_0 and Q5_0 weight
// rows four at a time in NEON with SDOT, the K-quants' rows one at a time,
// the rows left by qmmGo; the same bits as every quantized kernel.
func qmmNEONDot(a *qAct, w *Mat, lo, hi int, out []float32) {
	var row func(x *int8, meta *uint32, w *byte, nb int) float32
	switch a.dt {
	case Q4_K:
		row = qdotQ4KNEON
	case Q5_K:
		row = qdotQ5KNEON
	case Q6_K:
		row = qdotQ6KNEON
	}
	if row != nil && a.k >= qk {
		n, nb := w.Rows, a.k/qk
		rb, _ := w.DType.RowBytes(w.Cols)
		for j := lo; j < hi; j++ {
			for i := range a.m {
				out[i*n+j] = row(&a.xq[i*a.k], &a.meta[i*nb*16], &w.Q[j*rb], nb)
			}
		}
		return
	}
	var kernel func(x *int8, meta *uint32, w *byte, rb, nb int, out *float32)
	switch a.dt {
	case Q8_0:
		kernel = qdotQ8_0x4NEON
	case Q4_0:
		kernel = qdotQ4_0x4NEON
	case Q5_0:
		kernel = qdotQ5_0x4NEON
	}
	words, elems := metaWords(a.dt)
	nb := a.k / elems
	if kernel == nil || nb == 0 {
		qmmGo(a, w, lo, hi, out)
		return
	}
	n := w.Rows
	rb, _ := w.DType.RowBytes(w.Cols)
	var o [4]float32
	j := lo
	for ; j+4 <= hi; j += 4 {
		for i := range a.m {
			kernel(&a.xq[i*a.k], &a.meta[i*nb*words], &w.Q[j*rb], rb, nb, &o[0])
			for r, v := range o {
				out[i*n+j+r] = v
			}
		}
	}
	qmmGo(a, w, j, hi, out)
}
